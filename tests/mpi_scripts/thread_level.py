"""mpi4py initialized below MPI_THREAD_MULTIPLE: creating the runtime must fail clearly."""
import mpi4py

mpi4py.rc.thread_level = "serialized"
from mpi4py import MPI  # noqa: E402,F401  - initialized by the user before celeritas starts

import _setup  # noqa: E402,F401

import celeritas as cl  # noqa: E402

try:
    cl.Queue()
except cl.ConfigError as exc:
    print(f"ConfigError: {exc}", flush=True)
else:
    print("no error", flush=True)
