"""Backends: host (numpy, simulated devices), CUDA (CuPy) and OpenCL (PyOpenCL)."""
from .backend import (AllocationError, Backend, BackendError, Completion, DoneCompletion, Lane, LaneSkipped,
                      BackendInfo, box_view, copy_box)
from .host import HostBackend

__all__ = ["AllocationError", "Backend", "BackendError", "Completion", "DoneCompletion", "Lane", "LaneSkipped",
           "BackendInfo", "box_view", "copy_box", "HostBackend"]
