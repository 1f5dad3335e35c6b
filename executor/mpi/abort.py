"""Ending the whole MPI job when one rank fails, so that no peer waits forever."""
from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
import traceback
from pathlib import Path

_abort_lock = threading.Lock()
_hook_installed = False

ABORT_FORWARD_DELAY = 0.25   # seconds between the last words on stderr and MPI_Abort


_ROOT = Path(__file__).resolve().parents[2]
_OWN = tuple(str(_ROOT / d) + os.sep for d in ("celeritas", "scheduler", "executor"))
_LIBRARIES = tuple({str(Path(p).resolve()) + os.sep for p in (sysconfig.get_paths()["stdlib"],
                                                               sysconfig.get_paths()["purelib"],
                                                               sysconfig.get_paths()["platlib"]) if p})


def failure_origin(error: BaseException) -> list[str]:
    """Where the user's code failed, as Python's traceback would show it: the innermost
    frame outside celeritas' own packages (preferring the program's code to libraries),
    its source line, and the original exception of the chain.

    A one-line abort message (the exception celeritas wraps the failure in) loses
    all of that, and under MPI the rank dies before anyone sees a traceback.
    """
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and all(e is not c for c in chain):
        chain.append(e)
        e = e.__cause__ if e.__cause__ is not None else (None if e.__suppress_context__ else e.__context__)
    frame = fallback = None
    for exc in reversed(chain):                     # the original exception first
        for fs in reversed(traceback.extract_tb(exc.__traceback__)):
            path = str(Path(fs.filename).resolve()) if fs.filename and not fs.filename.startswith("<") else ""
            if path.startswith(_OWN):
                continue
            if fallback is None:
                fallback = fs
            if not path.startswith(_LIBRARIES):
                frame = fs
                break
        if frame is not None:
            break
    frame = frame or fallback
    lines = []
    if frame is not None:
        lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}')
        if frame.line:
            lines.append(f"    {frame.line.strip()}")
    original = chain[-1]
    if original is not error:
        lines.append("".join(traceback.format_exception_only(type(original), original)).strip())
    return lines


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
