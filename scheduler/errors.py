"""The error hierarchy of every layer.

It lives here because the scheduler imports nothing from ``celeritas/``; the
public package re-exports these names as ``cl.*Error``.
"""
from __future__ import annotations


class CeleritasError(Exception):
    """Base of every error celeritas raises on purpose."""


class ConfigError(CeleritasError, ValueError):
    """An invalid configuration value (environment variable or argument)."""


class GeometryError(CeleritasError, ValueError, TypeError):
    """A ``Box``, ``Subrange`` or ``Region`` was built from values that do not make one
    (also a ValueError and a TypeError, what such arguments raise elsewhere in Python)."""


class RangeMapperError(CeleritasError):
    """A range mapper failed or returned something that is not a region of the buffer."""


class AccessError(CeleritasError, IndexError):
    """An accessor was used outside what its range mapper grants, or in a wrong way."""


class DiagnosticError(AccessError):
    """A diagnostic (uninitialized read, overlapping writes) under policy ``error``."""


class KernelError(CeleritasError):
    """A kernel or host task raised; names task, kernel, rank and chunk."""


class OutOfMemoryError(CeleritasError, MemoryError):
    """An allocation did not fit; the message lists live allocations per memory."""


class DivergenceError(CeleritasError):
    """Ranks submitted different task streams."""


class CommunicationError(CeleritasError):
    """A peer failed or a message could not be delivered."""


def exception_text(exc: BaseException) -> str:
    """``str(exc)`` for an error message that wraps a user's exception, or a stand-in where
    its ``__str__`` itself raises (the wrapping error must still be raised, naming the culprit)."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - any failure to print is the user's exception's own
        return f"<{type(exc).__name__} whose str() raised>"
