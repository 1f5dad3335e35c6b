"""Whether the loaded MPI library can take CUDA device pointers."""
from __future__ import annotations

import os


def mpi_cuda_support(forced: bool | None = None) -> bool | None:
    """True/False, or None when nobody can tell.

    ``forced`` is the user's answer (``CELERITAS_MPI_CUDA_AWARE``, parsed by the
    runtime's configuration) for libraries that support CUDA without saying so;
    it wins.  mpi4py does not expose the query; MPICH (>= 4) and Open MPI export
    ``MPIX_Query_cuda_support`` from the library itself, so it is looked up in
    the MPI shared objects this process has mapped.  Cray MPICH with
    ``MPICH_GPU_SUPPORT_ENABLED=1`` counts as yes.
    """
    if forced is not None:
        return bool(forced)
    if os.environ.get("MPICH_GPU_SUPPORT_ENABLED") == "1":
        return True
    import ctypes
    import re
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return None
    libs = sorted({m for m in re.findall(r"(/\S+\.so[.\d]*)", maps) if "libmpi" in os.path.basename(m)})
    for lib in libs:
        try:
            fn = getattr(ctypes.CDLL(lib), "MPIX_Query_cuda_support", None)
        except OSError:
            continue
        if fn is not None:
            fn.restype = ctypes.c_int
            fn.argtypes = []
            return bool(fn())
    return None
