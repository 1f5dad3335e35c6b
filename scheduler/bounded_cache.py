"""The one memo shape the generators use: a dict that forgets everything when full.

Every memo in the scheduler is keyed by inputs that repeat step after step (a
stencil's splits, mapped regions, device chunk plans, coherence copies), so the
useful set is small and stable; when a program's pattern changes, the old entries
are dead.  Clearing on overflow keeps the bound with no per-hit bookkeeping (an LRU
would cost a move per hit on the hottest paths).  Caches belong to the generator
objects, never to modules, so that the ranks of a simulated cluster share nothing.
"""
from __future__ import annotations

from typing import Any, Hashable


class BoundedCache(dict):
    """``dict`` with a size bound: ``put`` clears it first when ``limit`` entries are held."""

    __slots__ = ("limit",)

    def __init__(self, limit: int):
        super().__init__()
        if limit < 1:
            raise ValueError(f"a cache needs room for at least one entry, got limit={limit}")
        self.limit = limit

    def put(self, key: Hashable, value: Any) -> Any:
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
