"""The MPI layer of the executor (mpi4py), one module per concern.

``launch``: was this process started under MPI, and importing mpi4py with the
thread level celeritas needs; ``abort``: ending every rank when one fails;
``progress``: MPI requests and the standing pilot receives, tested by the
executor thread itself; ``wire``: pilot encoding,
payload buffer specs and derived datatypes; ``divergence``: comparing the ranks'
task streams; ``cuda_aware``: whether MPI takes CUDA pointers;
``collective``: collective groups' mpi4py communicators; ``communicator``: the
``MpiCommunicator`` that ties them together.

Nothing here reads ``CELERITAS_*`` settings: the runtime's configuration parses
them and passes the values in.  Importing this package does not import mpi4py.
"""
from .abort import abort_world, install_excepthook
from .communicator import MpiCommunicator, mpi_info
from .cuda_aware import mpi_cuda_support
from .divergence import DEFAULT_DIVERGENCE_TIMEOUT, EpochCheck
from .launch import (ENV_SIZE_VARS, import_mpi, launched_under_mpi, launched_world_size, library_version,
                     thread_level_name)
from .progress import MpiRequest
from .wire import STRIDED_POLICIES, decode_pilot, encode_pilot, strided_layout

__all__ = ["MpiCommunicator", "MpiRequest", "EpochCheck", "DEFAULT_DIVERGENCE_TIMEOUT", "ENV_SIZE_VARS",
           "STRIDED_POLICIES", "launched_under_mpi", "launched_world_size", "import_mpi", "library_version",
           "thread_level_name", "abort_world", "install_excepthook", "encode_pilot", "decode_pilot", "mpi_info",
           "mpi_cuda_support", "strided_layout"]
