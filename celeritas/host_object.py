"""Host objects: Python objects that host tasks mutate in submission order."""
from __future__ import annotations

from typing import Any

from .context import Handle, current_runtime


class HostObject(Handle):
    """Wraps an object that host tasks use through ``cl.side_effect``; their order is the submit order."""

    _handle_kind = "host_object"

    def __init__(self, obj: Any = None):
        self._runtime = current_runtime(create=True)
        self._obj = obj
        self.id: int = self._runtime.create_host_object(self)
        self._alive = True

    @property
    def obj(self) -> Any:
        """The wrapped object (what ``cl.side_effect`` returns)."""
        return self._obj

    @obj.setter
    def obj(self, value: Any) -> None:
        # a host task with a side effect on this object may replace it (an int or a tuple
        # cannot change in place): later fences copy the new object, as they run after it
        self._obj = value
        if getattr(self, "_alive", False):
            self._runtime.retrack_host_object(self.id, value)

    def _require_alive(self) -> None:
        if not self._alive:
            from scheduler.errors import AccessError
            if self._runtime.is_shut_down:
                raise AccessError(f"host object H{self.id} belongs to a runtime that was shut down (q.shutdown() or "
                                  f"an error); make it again after the new Queue")
            raise AccessError(f"host object H{self.id} was destroyed (HostObject.destroy()); it cannot be used any more")

    def destroy(self) -> None:
        if getattr(self, "_alive", False):
            self._alive = False
            self._runtime.destroy_host_object(self.id)

    def __repr__(self) -> str:
        return f"<cl.HostObject H{self.id} {type(self.obj).__name__}>"


def side_effect(host_object: HostObject, cgh) -> Any:
    """Order this command group after earlier ones on ``host_object``; returns the object."""
    if not isinstance(host_object, HostObject):
        from scheduler.errors import CeleritasError
        raise CeleritasError(f"cl.side_effect takes a cl.HostObject, got {type(host_object).__name__}")
    from .handler import handler_of
    handler_of(cgh, "cl.side_effect")
    host_object._require_alive()
    if host_object not in cgh._side_effects:
        cgh._side_effects.append(host_object)
    return host_object.obj
