"""celeritas: a distributed multi-GPU runtime for Python in the style of SYCL and Celerity."""
from __future__ import annotations

from scheduler.errors import (AccessError, CeleritasError, CommunicationError, ConfigError,  # noqa: F401
                              DiagnosticError, DivergenceError, GeometryError, KernelError, OutOfMemoryError,
                              RangeMapperError)
from scheduler.geometry import Box, Region, Subrange  # noqa: F401
from executor.backends.backend import BackendError  # noqa: F401

from .accessor import DISCARD_READ_WRITE as discard_read_write  # noqa: F401
from .accessor import DISCARD_WRITE as discard_write  # noqa: F401
from .accessor import READ as read  # noqa: F401
from .accessor import READ_WRITE as read_write  # noqa: F401
from .accessor import WRITE as write  # noqa: F401
from .accessor import Accessor  # noqa: F401
from .buffer import Buffer, BufferError  # noqa: F401
from .graphs import GraphRecord  # noqa: F401
from .handler import (Chunk, CollectiveGroup, Partition, bit_and, bit_or, bit_xor, collective,  # noqa: F401
                      constrain_split, hint, logical_and, logical_or, maximum, minimum, multiplies, on_master_node,
                      once, oversubscribe, plus, reduction, split_1d, split_2d)
from .host_object import HostObject, side_effect  # noqa: F401
from .kernel import Kernel  # noqa: F401
from .queue import Queue  # noqa: F401
from .range_mappers import all, even_split, fixed, neighborhood, one_to_one, slice, transposed  # noqa: F401,A004
from . import testing  # noqa: F401

__version__ = "0.1.0"
