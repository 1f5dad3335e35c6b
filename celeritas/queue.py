"""The queue: where a program submits command groups and synchronizes."""
from __future__ import annotations

import concurrent.futures
from typing import Any, Callable

from .context import CopiesAsItself
from .runtime import Runtime


class Queue(CopiesAsItself):
    """Submits command groups to the runtime of this process (or simulated rank)."""

    def __init__(self, *, devices: str | None = None, lookahead: str | None = None, record: bool = False):
        self._rt = Runtime.current(create=True, devices=devices, lookahead=lookahead, record=record or None)

    @property
    def runtime(self) -> Runtime:
        return self._rt

    @property
    def rank(self) -> int:
        return self._rt.rank

    @property
    def num_ranks(self) -> int:
        return self._rt.num_ranks

    @property
    def num_devices(self) -> int:
        return self._rt.num_devices

    def submit(self, cgf: Callable[[Any], Any]) -> None:
        """Run ``cgf(cgh)`` now, on this thread, and turn what it declares into a task."""
        self._rt.submit(cgf)

    def fence(self, obj, subrange=None) -> concurrent.futures.Future:
        """A future of the buffer's (or subrange's) contents or of the host object, once written."""
        return self._rt.fence(obj, subrange)

    def wait(self, barrier: bool = False) -> None:
        """Block until everything submitted so far has completed (an epoch); ``barrier`` also syncs ranks."""
        self._rt.epoch("barrier" if barrier else "none")

    def flush(self) -> None:
        """Compile and start everything held back by lookahead."""
        self._rt.flush()

    def set_lookahead(self, mode: str) -> None:
        self._rt.set_lookahead(mode)

    def graphs(self):
        """Task, command and instruction graph records (needs ``record=True`` or ``CELERITAS_RECORD=1``)."""
        return self._rt.graphs()

    def shutdown(self) -> None:
        self._rt.shutdown()

    def __enter__(self) -> "Queue":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.shutdown()
        else:
            self._rt._abort()
