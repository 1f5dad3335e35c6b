"""What every device-queue backend (``executor.backends.device_queue``) must do, for the CUDA
backend on its CuPy stand-in and the OpenCL backend on PoCL alike."""
from __future__ import annotations

import threading
import time

from executor.backends.backend import LaneSkipped


def notifying(backend):
    """``backend`` with a notifier that records its completions (``backend.notified``)."""
    notified: list = []
    arrived = threading.Event()

    def note(c):
        notified.append(c)
        arrived.set()

    backend.set_notifier(note)
    backend.notified, backend.arrived = notified, arrived
    return backend


def wait_notified(backend, c, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while c not in backend.notified:
        assert time.monotonic() < deadline, "the lane's waiter never notified the completion"
        backend.arrived.wait(0.01)
        backend.arrived.clear()


def check_failed_enqueue_skips_dependent_work(backend, lane) -> None:
    """A failed ``enqueue_now`` fails its completion; dependent work on the lane is skipped,
    whether launched on its worker or enqueued; independent work still runs."""
    def broken():
        raise ValueError("bad launch")

    c = backend.enqueue_now(lane, broken)
    wait_notified(backend, c)
    assert isinstance(c.error(), ValueError)
    ran = []
    d = backend.launch(lane, lambda: ran.append(1), dependent=True)
    wait_notified(backend, d)
    assert ran == [] and isinstance(d.error(), LaneSkipped)
    e = backend.enqueue_now(lane, lambda: ran.append(2), dependent=True)
    wait_notified(backend, e)
    assert ran == [] and isinstance(e.error(), LaneSkipped)
    f = backend.enqueue_now(lane, lambda: ran.append(3))       # independent work still runs
    wait_notified(backend, f)
    assert ran == [3] and f.error() is None
