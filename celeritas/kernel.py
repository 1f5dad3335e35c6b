"""Device source kernels: CUDA / OpenCL C source launched by the GPU backends."""
from __future__ import annotations

from typing import Mapping

from scheduler.errors import CeleritasError


class Kernel:
    """``cl.Kernel(source={"cuda": ..., "opencl": ...}, name="entry")``.

    Its arguments are the ``args`` of ``parallel_for`` in order; an accessor
    passes a pointer plus the allocation's offset and extents.  Only the device
    backends run these; on host devices a kernel needs a Python implementation.
    """

    def __init__(self, source: Mapping[str, str] | str, name: str, *, options: tuple[str, ...] | str = ()):
        if isinstance(source, str):
            source = {"cuda": source, "opencl": source}
        if not isinstance(source, Mapping) or not source or not all(isinstance(v, str) for v in source.values()):
            raise CeleritasError("cl.Kernel needs source={'cuda': '...', 'opencl': '...'}")
        unknown = set(source) - {"cuda", "opencl"}
        if unknown:
            raise CeleritasError(f"cl.Kernel source languages are 'cuda' and 'opencl', got {sorted(unknown)}")
        if not isinstance(name, str) or not name.isidentifier():
            raise CeleritasError(f"cl.Kernel name must be the entry point's identifier, got {name!r}")
        self.source = dict(source)
        self.name = name
        self.__name__ = name
        # one string is one option string, as pyopencl and nvcc take it (tuple() of it made
        # single characters of "-DV=7", which the compiler refused as "-", "D", ...)
        options = (options,) if isinstance(options, str) else options
        try:
            options = tuple(options)
        except TypeError:
            raise CeleritasError(f"cl.Kernel {name!r}: options are a tuple of compiler option strings, got "
                                 f"{options!r}") from None
        for o in options:
            if not isinstance(o, str):
                raise CeleritasError(f"cl.Kernel {name!r}: options must be strings (compiler options), got {o!r}")
        self.options = options

    def __repr__(self) -> str:
        return f"cl.Kernel({self.name!r}, languages={sorted(self.source)})"
