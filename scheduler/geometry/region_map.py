"""Region maps: a value for every point of an extent (the generators' state)."""
from __future__ import annotations

from operator import itemgetter
from typing import Any

from .box import Box, _isect
from .region import Region, _normalize, _pairs_bounds

def _minus_v(a0, a1, b0, b1, v, out: list) -> None:
    """Append the pieces of box a outside the intersecting box b to ``out`` as (lo, hi, v);
    the same slabs as ``_box_minus``, for region-map entries (hot path: no checks)."""
    l0 = a0[0] if a0[0] > b0[0] else b0[0]
    h0 = a1[0] if a1[0] < b1[0] else b1[0]
    l1 = a0[1] if a0[1] > b0[1] else b0[1]
    h1 = a1[1] if a1[1] < b1[1] else b1[1]
    if a0[0] < l0:
        out.append((a0, (l0, a1[1], a1[2]), v))
    if h0 < a1[0]:
        out.append(((h0, a0[1], a0[2]), a1, v))
    if a0[1] < l1:
        out.append(((l0, a0[1], a0[2]), (h0, l1, a1[2]), v))
    if h1 < a1[1]:
        out.append(((l0, h1, a0[2]), (h0, a1[1], a1[2]), v))
    if a0[2] < b0[2]:
        out.append(((l0, l1, a0[2]), (h0, h1, b0[2]), v))
    if b1[2] < a1[2]:
        out.append(((l0, l1, b1[2]), (h0, h1, a1[2]), v))


def _split_entry(e: tuple, hits: list, nv, out: list) -> None:
    """Append entry ``e`` cut by the boxes ``hits`` (disjoint, each intersecting it): the
    parts outside keep e's value, the parts inside get ``nv``.  The general case of a
    region-map read or apply (the single containing box is handled inline by callers)."""
    a0, a1, v = e
    rest = [e]
    for w0, w1 in hits:
        nxt = []
        for r in rest:
            c0, c1, _ = r
            if (c1[0] <= w0[0] or w1[0] <= c0[0] or c1[1] <= w0[1] or w1[1] <= c0[1]
                    or c1[2] <= w0[2] or w1[2] <= c0[2]):
                nxt.append(r)
            else:
                _minus_v(c0, c1, w0, w1, v, nxt)
        rest = nxt
    out.extend(rest)
    for w0, w1 in hits:
        out.append(((a0[0] if a0[0] > w0[0] else w0[0], a0[1] if a0[1] > w0[1] else w0[1],
                     a0[2] if a0[2] > w0[2] else w0[2]),
                    (a1[0] if a1[0] < w1[0] else w1[0], a1[1] if a1[1] < w1[1] else w1[1],
                     a1[2] if a1[2] < w1[2] else w1[2]), nv))


class RegionMap:
    """A value for every point of an extent; values must be hashable.

    Representation: a flat list of disjoint ``(lo, hi, value)`` entries (3-tuples of
    ints for the corners) that covers the extent exactly.  Entries are *not* kept
    merged: an update removes what it overwrites (a box minus a box is at most six
    boxes) and appends the written boxes, which is a single pass over the entries with
    tuple arithmetic only, no region normalization.  Equal values are merged lazily:
    ``query`` returns, per value, the canonical decomposition of its part (so callers
    see as few boxes as the data allows, independently of the update history), and
    the entry list is compacted (re-merged per value) whenever it has doubled since the
    last compaction, so fragmentation stays bounded.

    The generators use the raw helpers (``values_in``, ``update_collect``,
    ``apply_collect``), which never merge: dependency tracking only needs the values.
    """

    __slots__ = ("extent", "dims", "_entries", "_compact_at", "_ext")

    def __init__(self, extent: Box, default: Any = None):
        self.extent = extent
        self.dims = extent.dims
        self._entries: list = [] if extent.empty else [(extent.lo, extent.hi, default)]
        self._compact_at = 16
        self._ext = None if extent.empty else (extent.lo, extent.hi)

    # ---- helpers ---------------------------------------------------------------
    def _clip_pairs(self, where) -> tuple | list:
        """``where`` (Box or Region) clipped to the extent, as disjoint (lo, hi) pairs."""
        ext = self._ext
        if type(where) is Box:
            lo, hi = where.lo, where.hi
            if ext is None or hi[0] <= lo[0]:   # (an empty box is [0, 0)^3)
                return ()
            e0, e1 = ext
            if (e0[0] <= lo[0] and hi[0] <= e1[0] and e0[1] <= lo[1] and hi[1] <= e1[1]
                    and e0[2] <= lo[2] and hi[2] <= e1[2]):
                return ((lo, hi),)
            r = _isect(lo, hi, e0, e1)
            return () if r is None else (r,)
        if not isinstance(where, Region):
            if isinstance(where, Box):   # (a subclass)
                if where.empty or ext is None:
                    return ()
                r = _isect(where.lo, where.hi, ext[0], ext[1])
                return () if r is None else (r,)
            raise TypeError(f"expected Region or Box, got {type(where).__name__}")
        p = where._pairs
        if not p or ext is None:
            return ()
        e0, e1 = ext
        if len(p) == 1:
            lo, hi = p[0]
            if (e0[0] <= lo[0] and hi[0] <= e1[0] and e0[1] <= lo[1] and hi[1] <= e1[1]
                    and e0[2] <= lo[2] and hi[2] <= e1[2]):
                return p
            r = _isect(lo, hi, e0, e1)
            return () if r is None else (r,)
        blo, bhi = where._bounds()
        if (e0[0] <= blo[0] and bhi[0] <= e1[0] and e0[1] <= blo[1] and bhi[1] <= e1[1]
                and e0[2] <= blo[2] and bhi[2] <= e1[2]):
            return p
        out = []
        for lo, hi in p:
            r = _isect(lo, hi, e0, e1)
            if r is not None:
                out.append(r)
        return out

    def _pieces(self, where) -> list:
        """Unmerged (lo, hi, value) pieces of the entries inside ``where`` (None: all)."""
        entries = self._entries
        if where is None:
            return list(entries)
        wp = self._clip_pairs(where)
        if not wp:
            return []
        out = []
        for b0, b1 in wp:
            for e in entries:
                a0, a1, v = e
                if (a1[0] <= b0[0] or b1[0] <= a0[0] or a1[1] <= b0[1] or b1[1] <= a0[1]
                        or a1[2] <= b0[2] or b1[2] <= a0[2]):
                    continue
                out.append(((a0[0] if a0[0] > b0[0] else b0[0], a0[1] if a0[1] > b0[1] else b0[1],
                             a0[2] if a0[2] > b0[2] else b0[2]),
                            (a1[0] if a1[0] < b1[0] else b1[0], a1[1] if a1[1] < b1[1] else b1[1],
                             a1[2] if a1[2] < b1[2] else b1[2]), v))
        return out

    @staticmethod
    def _group(pieces: list) -> dict:
        """value -> canonical pairs of its pieces (disjoint boxes; merged per value)."""
        groups: dict = {}
        for lo, hi, v in pieces:
            g = groups.get(v)
            if g is None:
                groups[v] = [(lo, hi)]
            else:
                g.append((lo, hi))
        for v, g in groups.items():
            if len(g) > 1:
                groups[v] = _normalize(g)
        return groups

    def _compact(self) -> None:
        """Re-merge the entries per value (canonical decomposition of each value's region)."""
        entries = self._entries
        if len(entries) > 1:
            groups = self._group(entries)
            if len(groups) == 1:
                # one value everywhere: the extent itself
                ext = self.extent
                entries = [(ext.lo, ext.hi, entries[0][2])]
            else:
                entries = [(lo, hi, v) for v, g in groups.items() for lo, hi in g]
            self._entries = entries
        n = 2 * len(entries)
        self._compact_at = n if n > 16 else 16

    def _write(self, wp, value, collect: list | None) -> None:
        """Set ``value`` on the disjoint pairs ``wp`` (inside the extent); when ``collect``
        is a list, append the old values of the overwritten parts to it."""
        entries = self._entries
        if len(wp) == 1:
            w0, w1 = wp[0]
            ext = self._ext
            if w0 == ext[0] and w1 == ext[1]:
                # the whole extent (fast path: epochs, reductions, full-buffer writes)
                if collect is not None:
                    collect.extend([e[2] for e in entries])
                self._entries = [(w0, w1, value)]
                return
            out = []
            keep = out.append
            x0, y0, z0 = w0
            x1, y1, z1 = w1
            for e in entries:
                a0, a1, v = e
                if a0[0] >= x1 or x0 >= a1[0] or a0[1] >= y1 or y0 >= a1[1] or a0[2] >= z1 or z0 >= a1[2]:
                    keep(e)   # disjoint (most entries are)
                    continue
                if collect is not None:
                    collect.append(v)
                if (x0 <= a0[0] and a1[0] <= x1 and y0 <= a0[1] and a1[1] <= y1
                        and z0 <= a0[2] and a1[2] <= z1):
                    continue  # entirely overwritten
                _minus_v(a0, a1, w0, w1, v, out)
            keep((w0, w1, value))
        else:
            blo, bhi = _pairs_bounds(wp)
            out = []
            for e in entries:
                a0, a1, v = e
                if not (a0[0] < bhi[0] and blo[0] < a1[0] and a0[1] < bhi[1] and blo[1] < a1[1]
                        and a0[2] < bhi[2] and blo[2] < a1[2]):
                    out.append(e)
                    continue
                rest = [e]
                hit = False
                for w0, w1 in wp:
                    nxt = []
                    for r in rest:
                        c0, c1, _ = r
                        if (c0[0] < w1[0] and w0[0] < c1[0] and c0[1] < w1[1] and w0[1] < c1[1]
                                and c0[2] < w1[2] and w0[2] < c1[2]):
                            hit = True
                            _minus_v(c0, c1, w0, w1, v, nxt)
                        else:
                            nxt.append(r)
                    rest = nxt
                    if not rest:
                        break
                if hit and collect is not None:
                    collect.append(v)
                out.extend(rest)
            out.extend([(lo, hi, value) for lo, hi in wp])
        self._entries = out
        if len(out) > self._compact_at:
            self._compact()

    # ---- public API --------------------------------------------------------------
    def update(self, where: "Region | Box", value: Any) -> None:
        wp = self._clip_pairs(where)
        if wp:
            self._write(wp, value, None)

    def update_collect(self, where: "Region | Box", value: Any) -> list:
        """``update``, returning the old values of the overwritten points (unmerged,
        possibly repeated): a write's dependencies in one pass."""
        wp = self._clip_pairs(where)
        if not wp:
            return []
        old: list = []
        self._write(wp, value, old)
        return old

    def items_in(self, where: "Region | Box | None" = None) -> list:
        """(lo, hi, value) pieces of the entries inside ``where`` (3-tuple corners), unmerged:
        together they cover ``where`` clipped to the extent, but equal values are not merged."""
        return self._pieces(where)

    def values_in(self, where: "Region | Box") -> list:
        """The values of the points inside ``where`` (unmerged, possibly repeated)."""
        wp = self._clip_pairs(where)
        if not wp:
            return []
        entries = self._entries
        if len(wp) == 1:
            (x0, y0, z0), (x1, y1, z1) = wp[0]
            return [v for a0, a1, v in entries
                    if a0[0] < x1 and x0 < a1[0] and a0[1] < y1 and y0 < a1[1] and a0[2] < z1 and z0 < a1[2]]
        out = []
        blo, bhi = _pairs_bounds(wp)
        for a0, a1, v in entries:
            if not (a0[0] < bhi[0] and blo[0] < a1[0] and a0[1] < bhi[1] and blo[1] < a1[1]
                    and a0[2] < bhi[2] and blo[2] < a1[2]):
                continue
            for w0, w1 in wp:
                if (a0[0] < w1[0] and w0[0] < a1[0] and a0[1] < w1[1] and w0[1] < a1[1]
                        and a0[2] < w1[2] and w0[2] < a1[2]):
                    out.append(v)
                    break
        return out

    def _apply(self, wp, fn, collect: list | None) -> None:
        """Replace each value v on the pairs ``wp`` by fn(v) (memoized per value)."""
        memo: dict = {}
        entries = self._entries
        out = []
        changed = False
        if len(wp) == 1:
            # one box (the common case): clip each entry, split only where the value changes
            w0, w1 = wp[0]
            for e in entries:
                a0, a1, v = e
                if (a1[0] <= w0[0] or w1[0] <= a0[0] or a1[1] <= w0[1] or w1[1] <= a0[1]
                        or a1[2] <= w0[2] or w1[2] <= a0[2]):
                    out.append(e)   # disjoint (checked first: most entries are)
                    continue
                l0 = a0[0] if a0[0] > w0[0] else w0[0]
                h0 = a1[0] if a1[0] < w1[0] else w1[0]
                l1 = a0[1] if a0[1] > w0[1] else w0[1]
                h1 = a1[1] if a1[1] < w1[1] else w1[1]
                l2 = a0[2] if a0[2] > w0[2] else w0[2]
                h2 = a1[2] if a1[2] < w1[2] else w1[2]
                if collect is not None:
                    collect.append(v)
                nv = memo.get(v, memo)
                if nv is memo:
                    nv = memo[v] = fn(v)
                if nv is v or nv == v:
                    out.append(e)
                    continue
                changed = True
                lo = (l0, l1, l2)
                hi = (h0, h1, h2)
                if lo == a0 and hi == a1:
                    out.append((a0, a1, nv))
                else:
                    _minus_v(a0, a1, w0, w1, v, out)
                    out.append((lo, hi, nv))
            if changed:
                self._entries = out
                if len(out) > self._compact_at:
                    self._compact()
            return
        # several boxes (disjoint): find the boxes an entry meets first, split only if its
        # value changes, and without subtracting when it lies inside one box
        blo, bhi = _pairs_bounds(wp)
        for e in entries:
            a0, a1, v = e
            if (a1[0] <= blo[0] or bhi[0] <= a0[0] or a1[1] <= blo[1] or bhi[1] <= a0[1]
                    or a1[2] <= blo[2] or bhi[2] <= a0[2]):
                out.append(e)
                continue
            hits = [w for w in wp
                    if not (a1[0] <= w[0][0] or w[1][0] <= a0[0] or a1[1] <= w[0][1] or w[1][1] <= a0[1]
                            or a1[2] <= w[0][2] or w[1][2] <= a0[2])]
            if not hits:
                out.append(e)
                continue
            if collect is not None:
                collect.append(v)
            nv = memo.get(v, memo)
            if nv is memo:
                nv = memo[v] = fn(v)
            if nv is v or nv == v:
                out.append(e)
                continue
            changed = True
            if len(hits) == 1:
                w0, w1 = hits[0]
                if (w0[0] <= a0[0] and a1[0] <= w1[0] and w0[1] <= a0[1] and a1[1] <= w1[1]
                        and w0[2] <= a0[2] and a1[2] <= w1[2]):
                    out.append((a0, a1, nv))
                    continue
            _split_entry(e, hits, nv, out)
        if changed:
            self._entries = out
            if len(out) > self._compact_at:
                self._compact()

    def apply(self, where: "Region | Box", fn) -> None:
        """Replace each value v inside ``where`` by ``fn(v)``."""
        wp = self._clip_pairs(where)
        if wp:
            self._apply(wp, fn, None)

    def apply_collect(self, where: "Region | Box", fn) -> list:
        """``apply``, returning the old values of the points inside ``where`` (unmerged,
        possibly repeated): a read's dependencies and its reader bookkeeping in one pass."""
        wp = self._clip_pairs(where)
        if not wp:
            return []
        old: list = []
        self._apply(wp, fn, old)
        return old

    def read_collect(self, where: "Region | Box", reader: int) -> list:
        """For maps whose values are ``(writer, frozenset of readers)`` (the generators'
        access maps): add ``reader`` to the readers inside ``where`` and return the old
        writers there (unmerged, possibly repeated, None included).

        Exactly ``apply_collect(where, lambda v: (v[0], v[1] | {reader}))`` with the
        writers of the collected values, without a Python call per entry: a read is the
        generators' most frequent map operation.
        """
        if type(where) is Box:
            # (inlined ``_clip_pairs`` for a box: most reads are of one box)
            w0, w1 = where.lo, where.hi
            ext = self._ext
            if ext is None or w1[0] <= w0[0]:
                return []
            e0, e1 = ext
            if not (e0[0] <= w0[0] and w1[0] <= e1[0] and e0[1] <= w0[1] and w1[1] <= e1[1]
                    and e0[2] <= w0[2] and w1[2] <= e1[2]):
                r = _isect(w0, w1, e0, e1)
                if r is None:
                    return []
                w0, w1 = r
        else:
            wp = self._clip_pairs(where)
            if not wp:
                return []
            if len(wp) != 1:
                return self._read_multi(wp, reader)
            w0, w1 = wp[0]
        x0, y0, z0 = w0
        x1, y1, z1 = w1
        entries = self._entries
        writers = []
        out = None
        memo: dict = {}
        for k, e in enumerate(entries):
            a0, a1, v = e
            if a1[0] <= x0 or x1 <= a0[0] or a1[1] <= y0 or y1 <= a0[1] or a1[2] <= z0 or z1 <= a0[2]:
                if out is not None:
                    out.append(e)
                continue
            writers.append(v[0])
            rs = v[1]
            if reader in rs:
                if out is not None:
                    out.append(e)
                continue
            nv = memo.get(v)
            if nv is None:
                nv = memo[v] = (v[0], rs | {reader})
            if out is None:
                out = entries[:k]
            if (w0[0] <= a0[0] and a1[0] <= w1[0] and w0[1] <= a0[1] and a1[1] <= w1[1]
                    and w0[2] <= a0[2] and a1[2] <= w1[2]):
                out.append((a0, a1, nv))
            else:
                _minus_v(a0, a1, w0, w1, v, out)
                out.append(((a0[0] if a0[0] > w0[0] else w0[0], a0[1] if a0[1] > w0[1] else w0[1],
                             a0[2] if a0[2] > w0[2] else w0[2]),
                            (a1[0] if a1[0] < w1[0] else w1[0], a1[1] if a1[1] < w1[1] else w1[1],
                             a1[2] if a1[2] < w1[2] else w1[2]), nv))
        if out is not None:
            self._entries = out
            if len(out) > self._compact_at:
                self._compact()
        return writers

    def _read_multi(self, wp, reader: int) -> list:
        """``read_collect`` on several disjoint pairs: ``_apply``'s multi-box branch with a
        function that adds ``reader`` (memoized there per value, so one call per value)."""
        seen: list = []
        self._apply(wp, lambda v: v if reader in v[1] else (v[0], v[1] | {reader}), seen)
        return [v[0] for v in seen]

    def apply_all(self, fn) -> None:
        """``apply`` over the whole extent, then re-merge unless the map is small (the
        epoch/horizon collapse, after which most entries have the same value)."""
        entries = self._entries
        if not entries:
            return
        memo: dict = {}
        out = []
        changed = False
        for e in entries:
            v = e[2]
            try:
                nv = memo[v]
            except KeyError:
                nv = memo[v] = fn(v)
            if nv is v or nv == v:
                out.append(e)
            else:
                changed = True
                out.append((e[0], e[1], nv))
        if changed:
            self._entries = out
            first = out[0][2]
            for e in out:
                if e[2] != first:
                    break
            else:
                ext = self.extent    # one value everywhere (typical after a collapse)
                self._entries = [(ext.lo, ext.hi, first)]
                self._compact_at = 16
                return
            if len(out) > 8:
                self._compact()

    def query(self, where: "Region | Box | None" = None) -> list[tuple[Box, Any]]:
        """(box, value) pairs covering ``where`` clipped to the extent (default: all of it),
        sorted by box; per value, the boxes are the canonical decomposition of its part."""
        pieces = self._pieces(where)
        d = self.dims
        mk = Box.from_bounds
        if len(pieces) <= 1:
            return [(mk(lo, hi, d), v) for lo, hi, v in pieces]
        v0 = pieces[0][2]
        for p in pieces:
            if p[2] != v0:
                break
        else:
            # one value: its part is ``where`` itself, canonical already when the extent
            # did not clip it (a Region's pairs are its canonical decomposition)
            if type(where) is Region and self._clip_pairs(where) is where._pairs:
                return [(mk(lo, hi, d), v0) for lo, hi in where._pairs]
        if len({p[2] for p in pieces}) == len(pieces):
            found = pieces   # one box per value: each is canonical as it is
        else:
            found = [(lo, hi, v) for v, g in self._group(pieces).items() for lo, hi in g]
        if len(found) > 1:
            found.sort(key=_itemgetter0)  # disjoint boxes never share a min corner
        return [(mk(lo, hi, d), v) for lo, hi, v in found]

    def query_values(self, where: "Region | Box | None" = None) -> list[tuple[Region, Any]]:
        """Like ``query`` but one (region, value) per distinct value, ordered by region."""
        d = self.dims
        out = [(Region._from_pairs(g, d, True), v) for v, g in self._group(self._pieces(where)).items()]
        if len(out) > 1:
            out.sort(key=lambda rv: rv[0]._pairs[0])
        return out

    def region_of(self, predicate) -> Region:
        """The region of all points whose value satisfies ``predicate``."""
        memo: dict = {}
        pairs = []
        for lo, hi, v in self._entries:
            try:
                ok = memo[v]
            except KeyError:
                ok = memo[v] = bool(predicate(v))
            if ok:
                pairs.append((lo, hi))
        if len(pairs) > 1:
            pairs.sort()
            return Region._from_pairs(_normalize(pairs), self.dims, True)
        return Region._from_pairs(pairs, self.dims, True)

    def values(self) -> set:
        return {e[2] for e in self._entries}

    # ---- memoization ----------------------------------------------------------------
    def snapshot(self, relabel=None) -> tuple:
        """The map's exact state as a hashable value: equal snapshots mean identical
        future behaviour (queries, updates and their results), so a generator may key
        memoized work by them and ``restore`` the state its memo recorded.  ``relabel``
        maps every value first (once per distinct value): replay stores ids relative to
        a base, so that the states of successive steps compare equal."""
        entries = self._entries
        if relabel is not None:
            memo: dict = {}
            out = []
            for lo, hi, v in entries:
                nv = memo.get(v, memo)
                if nv is memo:
                    nv = memo[v] = relabel(v)
                out.append((lo, hi, nv))
            entries = out
        return (self._ext, self.dims, self._compact_at, tuple(entries))

    def restore(self, snapshot: tuple, relabel=None) -> None:
        """Set the state taken by ``snapshot`` (of a map with the same extent), with every
        value mapped through ``relabel`` (the inverse of the one given to ``snapshot``)."""
        ext, dims, compact_at, entries = snapshot
        if ext != self._ext or dims != self.dims:
            raise ValueError(f"snapshot of a map over {ext} restored into a map over {self._ext}")
        if relabel is None:
            self._entries = list(entries)
        else:
            memo: dict = {}
            out = []
            for lo, hi, v in entries:
                nv = memo.get(v, memo)
                if nv is memo:
                    nv = memo[v] = relabel(v)
                out.append((lo, hi, nv))
            self._entries = out
        self._compact_at = compact_at

    def __len__(self) -> int:
        """Number of boxes of the canonical decomposition (per value)."""
        self._compact()
        return len(self._entries)


_itemgetter0 = itemgetter(0)

