"""The horizon and epoch protocol, shared by the task, command and instruction graphs.

All three levels bound their graphs the same way (Celerity's horizons):

* the **execution front** is the set of nodes nothing depends on yet; a new node
  removes its dependencies from it and joins it;
* a **horizon** or an **epoch** depends on the whole front, which then holds only it;
* when a horizon is generated, the *previous* horizon becomes the epoch for new
  nodes (an epoch does so at once): every node older than it is from then on
  represented by it, so the per-buffer "last writer / readers" state collapses onto
  it and everything older can be forgotten.

``EpochTracker`` is that state; ``collapse_writer`` and ``collapse_access`` are the
collapse applied to the generators' region-map values.
"""
from __future__ import annotations

from typing import Any


class EpochTracker:
    """Execution front, current horizon and epoch-for-new-nodes of one generator.

    ``front`` maps node id to whatever the generator needs back when the front
    collapses (the node object, or None).
    """

    __slots__ = ("front", "current_horizon", "epoch")

    def __init__(self) -> None:
        self.front: dict[int, Any] = {}
        self.current_horizon: int | None = None
        self.epoch: int | None = None

    def add(self, node_id: int, dep_ids, node: Any = None) -> None:
        """A new node with these dependencies joins the front; its dependencies leave it."""
        front = self.front
        for d in dep_ids:
            front.pop(d, None)
        front[node_id] = node

    def collapse_front(self) -> list:
        """The front in id order (a horizon's or epoch's dependencies), then emptied."""
        front = self.front
        out = [front[k] for k in sorted(front)]
        front.clear()
        return out

    def horizon(self, hid: int) -> int | None:
        """Horizon ``hid`` was generated: returns the previous horizon, which now becomes
        the epoch for new nodes, or None."""
        prev = self.current_horizon
        self.current_horizon = hid
        if prev is not None:
            self.epoch = prev
        return prev

    def epoch_generated(self, eid: int) -> None:
        """Epoch ``eid`` was generated: it is the epoch for new nodes at once, and the
        current horizon, now behind it, will never become one."""
        self.current_horizon = None
        self.epoch = eid


def collapse_writer(value: int | None, eid: int) -> int | None:
    """A last-writer id older than epoch ``eid`` is represented by the epoch."""
    return eid if value is not None and value < eid else value


def collapse_access(value: tuple, eid: int) -> tuple:
    """``(last writer, readers since)`` with every id older than ``eid`` replaced by it."""
    w, rs = value
    nw = eid if w is not None and w < eid else w
    if rs and min(rs) < eid:
        rs = frozenset([r for r in rs if r >= eid] + [eid])
    return value if nw == w and rs is value[1] else (nw, rs)


def collapse_map(mapping: dict, eid: int, replacement: Any = None, key=None) -> None:
    """Values of ``mapping`` older than epoch ``eid`` are replaced by ``replacement``
    (default: ``eid`` itself).  Values are ids, or nodes whose id ``key`` returns."""
    if replacement is None:
        replacement = eid
    for k, v in mapping.items():
        if v is not None and (v if key is None else key(v)) < eid:
            mapping[k] = replacement


def forget_before(live: dict, eid: int) -> None:
    """Drop the commands older than ``eid`` from ``live`` (registered in increasing id order)."""
    old = []
    for cid in live:
        if cid >= eid:
            break
        old.append(cid)
    for cid in old:
        del live[cid]
