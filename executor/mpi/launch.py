"""Whether this process was started by an MPI launcher, and importing mpi4py for celeritas.

Launch detection reads the launcher's environment rather than asking MPI, so
that deciding whether to use MPI never initializes MPI in a plain
``python script.py`` run.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Any

from scheduler.errors import ConfigError

log = logging.getLogger("celeritas.mpi")

# world size as announced by Hydra/MPICH/Intel MPI/Slurm PMI, OpenMPI, MVAPICH
ENV_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launched_world_size() -> int | None:
    """The world size the launcher announced in the environment, if any."""
    for var in ENV_SIZE_VARS:
        raw = os.environ.get(var)
        if raw:
            try:
                return int(raw)
            except ValueError:
                continue
    if os.environ.get("SLURM_STEP_ID") not in (None, "", "batch", "4294967294") and \
            os.environ.get("SLURM_STEP_NUM_TASKS"):
        try:
            return int(os.environ["SLURM_STEP_NUM_TASKS"])
        except ValueError:
            return None
    return None


def launched_under_mpi() -> bool:
    """True when started by ``mpiexec``/``srun`` with more than one rank.

    One-rank launches use the single-rank communicator: there is nobody to
    talk to, and it spares the MPI start-up.
    """
    n = launched_world_size()
    return n is not None and n > 1


_THREAD_LEVELS = {0: "MPI_THREAD_SINGLE", 1: "MPI_THREAD_FUNNELED", 2: "MPI_THREAD_SERIALIZED",
                  3: "MPI_THREAD_MULTIPLE"}


def import_mpi() -> Any:
    """``mpi4py.MPI``, initialized with ``MPI_THREAD_MULTIPLE``; ConfigError otherwise.

    ``MPI_THREAD_MULTIPLE`` is required: the executor thread, host-task lane
    threads (collective groups hand out mpi4py communicators) and the
    application thread may all call MPI.  A library that provides less is
    rejected up front rather than crashing later.
    """
    try:
        import mpi4py
    except ImportError as exc:
        raise ConfigError(f"this job was launched under MPI with {launched_world_size()} ranks, but mpi4py "
                          f"is not installed: pip install 'celeritas[mpi]' ({exc})") from None
    if "mpi4py.MPI" not in sys.modules:
        if mpi4py.rc.thread_level != "multiple":
            log.warning("mpi4py.rc.thread_level=%r overridden: celeritas needs MPI_THREAD_MULTIPLE",
                        mpi4py.rc.thread_level)
        mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    provided = MPI.Query_thread()
    if provided < MPI.THREAD_MULTIPLE:
        lib = library_version(MPI)
        raise ConfigError(
            f"the MPI library ({lib}) provides {_THREAD_LEVELS.get(provided, provided)}, but celeritas needs "
            f"MPI_THREAD_MULTIPLE: its executor thread and collective host tasks call MPI concurrently. "
            f"Use an MPI built with thread support, and do not set mpi4py.rc.thread_level to a lower "
            f"level before celeritas starts.")
    return MPI


def library_version(mpi: Any) -> str:
    """First line of ``MPI_Get_library_version``, whitespace collapsed."""
    text = mpi.Get_library_version().strip()
    return " ".join(text.splitlines()[0].split()) if text else "?"


def thread_level_name(level: int) -> str:
    return _THREAD_LEVELS.get(level, str(level))
