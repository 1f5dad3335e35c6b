"""Backends: host (numpy, simulated devices) now; CUDA (CuPy) and OpenCL later."""
from .backend import (AllocationError, Backend, BackendError, Completion, DoneCompletion, Lane,
                      SystemInfo, box_view, copy_box)
from .host import HostBackend

__all__ = ["AllocationError", "Backend", "BackendError", "Completion", "DoneCompletion", "Lane",
           "SystemInfo", "box_view", "copy_box", "HostBackend"]
