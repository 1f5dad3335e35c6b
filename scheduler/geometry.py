"""Exact region arithmetic: boxes, normalized regions and region maps.

Everything is stored as 3-D (unused dimensions span ``[0, 1)``) so that the
arithmetic has a single code path; ``dims`` only decides how a box is shown to
the user.  The hot paths work on plain tuples of ints: no numpy per operation,
because the scheduler does thousands of these per task.
"""
from __future__ import annotations

from operator import itemgetter
from typing import Any, Iterable, Iterator, Sequence

_EMPTY_LO = (0, 0, 0)
_EMPTY_HI = (0, 0, 0)
_UNIT_HI = (1, 1, 1)


def _pad(values: Sequence[int], fill: int) -> tuple[int, int, int]:
    n = len(values)
    if n == 3:
        return (int(values[0]), int(values[1]), int(values[2]))
    if n == 2:
        return (int(values[0]), int(values[1]), fill)
    if n == 1:
        return (int(values[0]), fill, fill)
    if n == 0:
        return (0, 0, 0) if fill == 0 else (1, 1, 1)
    raise ValueError(f"at most 3 dimensions are supported, got {n}")


class Box:
    """A half-open box ``[min, max)``; every empty box is the same box."""

    __slots__ = ("lo", "hi", "dims")

    def __init__(self, min: Sequence[int] = (), max: Sequence[int] = (), dims: int | None = None):
        if dims is None:
            dims = len(min)
        if len(max) != len(min):
            raise ValueError(f"box min {tuple(min)} and max {tuple(max)} differ in dimensionality")
        lo = _pad(min, 0)
        hi = _pad(max, 1)
        if hi[0] <= lo[0] or hi[1] <= lo[1] or hi[2] <= lo[2]:
            lo, hi = _EMPTY_LO, _EMPTY_HI
        self.lo = lo
        self.hi = hi
        self.dims = dims

    @classmethod
    def _make(cls, lo: tuple[int, int, int], hi: tuple[int, int, int], dims: int) -> "Box":
        """Construct from already padded, non-empty 3-tuples (hot path: no checks)."""
        b = object.__new__(cls)
        b.lo = lo
        b.hi = hi
        b.dims = dims
        return b

    @classmethod
    def from_subrange(cls, offset: Sequence[int], range: Sequence[int]) -> "Box":
        return cls(tuple(offset), tuple(o + r for o, r in zip(offset, range)), len(offset))

    @classmethod
    def empty_box(cls, dims: int) -> "Box":
        return _empty_box(dims)

    @classmethod
    def full(cls, shape: Sequence[int]) -> "Box":
        return cls((0,) * len(shape), tuple(shape), len(shape))

    # user-facing views in the box's own dimensionality
    @property
    def min(self) -> tuple[int, ...]:
        return self.lo[: self.dims]

    @property
    def max(self) -> tuple[int, ...]:
        return self.hi[: self.dims]

    @property
    def offset(self) -> tuple[int, ...]:
        return self.lo[: self.dims]

    @property
    def range(self) -> tuple[int, ...]:
        lo, hi = self.lo, self.hi
        return tuple(hi[i] - lo[i] for i in range(self.dims))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.range

    @property
    def area(self) -> int:
        lo, hi = self.lo, self.hi
        return (hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2])

    @property
    def empty(self) -> bool:
        return self.hi[0] == 0 and self.lo == _EMPTY_LO and self.hi == _EMPTY_HI

    def __bool__(self) -> bool:
        return not self.empty

    @property
    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(self.lo[i], self.hi[i]) for i in range(self.dims))

    def slices_in(self, origin: "Box") -> tuple[slice, ...]:
        """Slices of this box relative to ``origin``'s min (allocation-local indexing)."""
        lo, hi, o = self.lo, self.hi, origin.lo
        return tuple([slice(lo[i] - o[i], hi[i] - o[i]) for i in range(self.dims)])   # (list: faster)

    def with_dims(self, dims: int) -> "Box":
        if dims == self.dims:
            return self
        return _empty_box(dims) if self.empty else Box._make(self.lo, self.hi, dims)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Box):
            return NotImplemented
        return self.lo == other.lo and self.hi == other.hi

    def __hash__(self) -> int:
        return hash((self.lo, self.hi))

    def __repr__(self) -> str:
        if self.empty:
            return "Box(empty)"
        return f"Box({list(self.min)}, {list(self.max)})"

    def intersects(self, other: "Box") -> bool:
        a0, a1 = self.lo, self.hi
        b0, b1 = other.lo, other.hi
        # (an empty box is [0, 0)^3, which must not "intersect" a box around the origin)
        return (a0[0] < b1[0] and b0[0] < a1[0] and a0[1] < b1[1] and b0[1] < a1[1]
                and a0[2] < b1[2] and b0[2] < a1[2] and a0[0] < a1[0] and b0[0] < b1[0])

    def __and__(self, other: "Box") -> "Box":
        if not isinstance(other, Box):
            return NotImplemented  # box & region: Region.__rand__
        r = _isect(self.lo, self.hi, other.lo, other.hi)
        dims = self.dims if self.dims >= other.dims else other.dims
        if r is None:
            return _empty_box(dims)
        return Box._make(r[0], r[1], dims)

    def __or__(self, other: "Box | Region") -> "Region":
        """Union as a Region (box | box, box | region)."""
        if isinstance(other, Box):
            return Region.from_box(self).union(other)
        return NotImplemented

    def __sub__(self, other: "Box | Region") -> "Region":
        """Difference as a Region (box - box, box - region)."""
        if isinstance(other, Box):
            return Region.from_box(self).difference(other)
        return NotImplemented

    def contains(self, other: "Box | Sequence[int]") -> bool:
        lo, hi = self.lo, self.hi
        if isinstance(other, Box):
            if other.empty:
                return True
            o0, o1 = other.lo, other.hi
            return (lo[0] <= o0[0] and o1[0] <= hi[0] and lo[1] <= o0[1] and o1[1] <= hi[1]
                    and lo[2] <= o0[2] and o1[2] <= hi[2])
        p = _pad(tuple(other), 0)
        return lo[0] <= p[0] < hi[0] and lo[1] <= p[1] < hi[1] and lo[2] <= p[2] < hi[2]

    def __contains__(self, other: "Box | Sequence[int]") -> bool:
        return self.contains(other)

    def bounding(self, other: "Box") -> "Box":
        if self.empty:
            return other
        if other.empty:
            return self
        a0, a1, b0, b1 = self.lo, self.hi, other.lo, other.hi
        return Box._make((min(a0[0], b0[0]), min(a0[1], b0[1]), min(a0[2], b0[2])),
                         (max(a1[0], b1[0]), max(a1[1], b1[1]), max(a1[2], b1[2])),
                         max(self.dims, other.dims))

    def to_json(self) -> list[list[int]]:
        return [list(self.min), list(self.max)]


def _empty_box(dims: int) -> Box:
    b = object.__new__(Box)
    b.lo = _EMPTY_LO
    b.hi = _EMPTY_HI
    b.dims = dims
    return b


def _isect(a0, a1, b0, b1):
    l0 = a0[0] if a0[0] > b0[0] else b0[0]
    h0 = a1[0] if a1[0] < b1[0] else b1[0]
    if h0 <= l0:
        return None
    l1 = a0[1] if a0[1] > b0[1] else b0[1]
    h1 = a1[1] if a1[1] < b1[1] else b1[1]
    if h1 <= l1:
        return None
    l2 = a0[2] if a0[2] > b0[2] else b0[2]
    h2 = a1[2] if a1[2] < b1[2] else b1[2]
    if h2 <= l2:
        return None
    return (l0, l1, l2), (h0, h1, h2)


def _box_minus(a0, a1, b0, b1, out: list) -> None:
    """Append the (at most 6) disjoint pieces of box a outside box b to ``out``.

    Sorted, the pieces are the canonical decomposition of ``a - b``: slabs along
    dim 0, then dim 1, then intervals along dim 2.
    """
    r = _isect(a0, a1, b0, b1)
    if r is None:
        out.append((a0, a1))
        return
    i0, i1 = r
    # slabs along dim 0
    if a0[0] < i0[0]:
        out.append((a0, (i0[0], a1[1], a1[2])))
    if i1[0] < a1[0]:
        out.append(((i1[0], a0[1], a0[2]), a1))
    # within the dim-0 overlap, slabs along dim 1
    if a0[1] < i0[1]:
        out.append(((i0[0], a0[1], a0[2]), (i1[0], i0[1], a1[2])))
    if i1[1] < a1[1]:
        out.append(((i0[0], i1[1], a0[2]), (i1[0], a1[1], a1[2])))
    # within the dim-0/1 overlap, pieces along dim 2
    if a0[2] < i0[2]:
        out.append(((i0[0], i0[1], a0[2]), (i1[0], i1[1], i0[2])))
    if i1[2] < a1[2]:
        out.append(((i0[0], i0[1], i1[2]), (i1[0], i1[1], a1[2])))


# ----------------------------------------------------------------------------------
# Canonical form and exact set operations.
#
# The canonical decomposition of a point set: slabs along dim 0 where the
# cross-section (itself canonical, recursively) is constant, adjacent slabs with
# equal cross-sections merged; along the last dimension, maximal intervals.  It is
# unique per point set, comes out sorted, and makes every box maximal along the
# fastest (last) dimension.  ``Region._pairs`` is this decomposition, flattened
# into ((lo0, lo1, lo2), (hi0, hi1, hi2)) pairs.
#
# Set operations work on the same decomposition seen as nested *step functions*
# ("sf"): a level-0 sf is a list of (x, cross_section) breakpoints along dim 0, the
# cross-section holding on [x, next x) and the last one empty; a level-1 sf is the
# same along dim 1 with level-2 values; a level-2 value is a flat list of interval
# boundaries along dim 2 [a0, b0, a1, b1, ...].  Consecutive values always differ
# (canonical), so equality of cross-sections is list equality, and a union,
# intersection or difference is one merge-sweep over the breakpoints per level,
# linear in the sizes of the operands, whose output is canonical by construction.
# ----------------------------------------------------------------------------------

_OR, _AND, _SUB = 0, 1, 2
_NIL: list = []  # the empty value at every level (shared, never mutated)


def _op2(a: list, b: list, op: int) -> list:
    """Set operation on two flat sorted lists of non-touching intervals."""
    if op == _OR:
        if not a:
            return b
        if not b:
            return a
        if a[-1] <= b[0]:
            return a + b if a[-1] < b[0] else a[:-1] + b[1:]
        if b[-1] <= a[0]:
            return b + a if b[-1] < a[0] else b[:-1] + a[1:]
    elif op == _AND:
        if not a or not b or a[-1] <= b[0] or b[-1] <= a[0]:
            return _NIL
    else:
        if not a:
            return _NIL
        if not b or a[-1] <= b[0] or b[-1] <= a[0]:
            return a
    if a == b:
        return _NIL if op == _SUB else a
    out: list = []
    na = len(a)
    nb = len(b)
    i = j = 0
    ina = inb = cur = False
    while i < na and j < nb:
        x = a[i]
        y = b[j]
        if x < y:
            ina = not ina
            i += 1
        elif y < x:
            inb = not inb
            j += 1
            x = y
        else:
            ina = not ina
            inb = not inb
            i += 1
            j += 1
        if op == _OR:
            s = ina or inb
        elif op == _AND:
            s = ina and inb
        else:
            s = ina and not inb
        if s is not cur:
            out.append(x)
            cur = s
    if i < na:
        if op != _AND:
            out.extend(a[i:])
    elif j < nb and op == _OR:
        out.extend(b[j:])
    return out or _NIL


def _opn(a: list, b: list, op: int, inner) -> list:
    """Set operation on two step functions whose values combine with ``inner``."""
    if op == _OR:
        if not a:
            return b
        if not b:
            return a
        if a[-1][0] < b[0][0]:
            return a + b
        if b[-1][0] < a[0][0]:
            return b + a
    elif op == _AND:
        if not a or not b or a[-1][0] <= b[0][0] or b[-1][0] <= a[0][0]:
            return _NIL
    else:
        if not a:
            return _NIL
        if not b or a[-1][0] <= b[0][0] or b[-1][0] <= a[0][0]:
            return a
    if a == b:
        return _NIL if op == _SUB else a
    out: list = []
    na = len(a)
    nb = len(b)
    i = j = 0
    va = vb = cur = _NIL
    while i < na and j < nb:
        ea = a[i]
        eb = b[j]
        x = ea[0]
        y = eb[0]
        if x < y:
            va = ea[1]
            i += 1
        elif y < x:
            vb = eb[1]
            j += 1
            x = y
        else:
            va = ea[1]
            vb = eb[1]
            i += 1
            j += 1
        if op == _OR:
            if not va:
                v = vb
            elif not vb or va is vb:
                v = va
            else:
                v = inner(va, vb, op)
        elif op == _AND:
            if not va or not vb:
                v = _NIL
            elif va is vb:
                v = va
            else:
                v = inner(va, vb, op)
        else:
            if not va or va is vb:
                v = _NIL
            elif not vb:
                v = va
            else:
                v = inner(va, vb, op)
        if v != cur:
            out.append((x, v))
            cur = v
    if i < na:
        if op != _AND:
            out.extend(a[i:])
    elif j < nb and op == _OR:
        out.extend(b[j:])
    return out or _NIL


def _op1(a: list, b: list, op: int) -> list:
    return _opn(a, b, op, _op2)


def _op0(a: list, b: list, op: int) -> list:
    return _opn(a, b, op, _op1)


def _box_sf(lo, hi) -> list:
    return [(lo[0], [(lo[1], [lo[2], hi[2]]), (hi[1], _NIL)]), (hi[0], _NIL)]


def _to_sf(pairs) -> list:
    """Step function of sorted, disjoint pairs grouped like a canonical decomposition.

    Touching groups with equal cross-sections are merged, so this also canonicalizes
    inputs that are canonical up to such merges (e.g. a canonical region clipped to a
    box).  Every list it builds ends with an (end, NIL) terminator.
    """
    n = len(pairs)
    if not n:
        return _NIL
    out: list = []
    lprev = None
    k = 0
    lo, hi = pairs[0]
    while k < n:
        x0 = lo[0]
        x1 = hi[0]
        l1: list = []
        iprev = None
        while True:
            y0 = lo[1]
            y1 = hi[1]
            iv = [lo[2], hi[2]]
            k += 1
            while k < n:
                lo, hi = pairs[k]
                if lo[0] != x0 or lo[1] != y0:
                    break
                iv.append(lo[2])
                iv.append(hi[2])
                k += 1
            if l1 and l1[-1][0] == y0:
                if iv == iprev:
                    l1[-1] = (y1, _NIL)
                else:
                    l1[-1] = (y0, iv)
                    l1.append((y1, _NIL))
                    iprev = iv
            else:
                l1.append((y0, iv))
                l1.append((y1, _NIL))
                iprev = iv
            if k >= n or lo[0] != x0:
                break
        if out and out[-1][0] == x0:
            if l1 == lprev:
                out[-1] = (x1, _NIL)
            else:
                out[-1] = (x0, l1)
                out.append((x1, _NIL))
                lprev = l1
        else:
            out.append((x0, l1))
            out.append((x1, _NIL))
            lprev = l1
    return out


def _from_sf(sf: list) -> tuple:
    out = []
    for k in range(len(sf) - 1):
        x0, l1 = sf[k]
        if not l1:
            continue
        x1 = sf[k + 1][0]
        for m in range(len(l1) - 1):
            y0, iv = l1[m]
            if not iv:
                continue
            y1 = l1[m + 1][0]
            for t in range(0, len(iv), 2):
                out.append(((x0, y0, iv[t]), (x1, y1, iv[t + 1])))
    return tuple(out)


def _merge_intervals(ivs: list) -> list:
    ivs.sort()
    out: list = []
    cur_lo, cur_hi = ivs[0]
    for lo, hi in ivs:
        if lo <= cur_hi:
            if hi > cur_hi:
                cur_hi = hi
        else:
            out.append((cur_lo, cur_hi))
            cur_lo, cur_hi = lo, hi
    out.append((cur_lo, cur_hi))
    return out


def _normalize(pairs) -> tuple:
    """Canonical decomposition of possibly overlapping non-empty boxes (as pairs)."""
    n = len(pairs)
    if n <= 1:
        return tuple(pairs)
    lo, hi = pairs[0]
    l1, l2, h1, h2 = lo[1], lo[2], hi[1], hi[2]
    same1 = True
    for lo, hi in pairs:
        if lo[2] != l2 or hi[2] != h2:
            # a 3-D decomposition: balanced unions of step functions
            return _from_sf(_normalize_sf(pairs))
        if same1 and (lo[1] != l1 or hi[1] != h1):
            same1 = False
    if same1:
        # every box has the same cross-section (always so in 1-D): merge along dim 0
        return tuple([((a, l1, l2), (b, h1, h2))
                      for a, b in _merge_intervals([(lo[0], hi[0]) for lo, hi in pairs])])
    return _normalize_2d(pairs, l2, h2)


def _normalize_2d(pairs, z0: int, z1: int) -> tuple:
    """Canonical decomposition of boxes sharing their dim-2 extent [z0, z1): a sweep
    along dim 0 with the merged dim-1 intervals of the active boxes as cross-section."""
    xs = sorted({lo[0] for lo, _ in pairs} | {hi[0] for _, hi in pairs})
    boxes = sorted(pairs)
    n = len(boxes)
    k = 0
    active: list = []
    out: list = []
    prev = None
    slab_lo = 0
    for i in range(len(xs) - 1):
        a = xs[i]
        while k < n and boxes[k][0][0] == a:
            active.append(boxes[k])
            k += 1
        active = [b for b in active if b[1][0] > a]
        if active:
            if len(active) == 1:
                cs = [(active[0][0][1], active[0][1][1])]
            else:
                cs = _merge_intervals([(lo[1], hi[1]) for lo, hi in active])
        else:
            cs = None
        if cs != prev:
            if prev:
                for l, h in prev:
                    out.append(((slab_lo, l, z0), (a, h, z1)))
            prev = cs
            slab_lo = a
    if prev:
        b = xs[-1]
        for l, h in prev:
            out.append(((slab_lo, l, z0), (b, h, z1)))
    return tuple(out)


def _normalize_sf(pairs) -> list:
    """Step function of the union of arbitrary non-empty boxes (balanced pairwise unions)."""
    sfs = [_box_sf(lo, hi) for lo, hi in sorted(pairs)]
    while len(sfs) > 1:
        nxt = [_op0(sfs[i], sfs[i + 1], _OR) for i in range(0, len(sfs) - 1, 2)]
        if len(sfs) & 1:
            nxt.append(sfs[-1])
        sfs = nxt
    return sfs[0] if sfs else _NIL


def _pairs_bounds(p) -> tuple:
    if len(p) == 1:
        return p[0]
    (l0, l1, l2), (h0, h1, h2) = p[0]  # sorted: the first box has the smallest dim-0 start
    for lo, hi in p:
        if lo[1] < l1:
            l1 = lo[1]
        if lo[2] < l2:
            l2 = lo[2]
        if hi[0] > h0:
            h0 = hi[0]
        if hi[1] > h1:
            h1 = hi[1]
        if hi[2] > h2:
            h2 = hi[2]
    return (l0, l1, l2), (h0, h1, h2)


class Region:
    """A normalized set of disjoint boxes; one representation per point set."""

    # _pairs: the canonical decomposition (see above); the rest are lazily computed
    # caches: _boxes (Box objects), _sf (step function), _bb (bounds), _fl (for
    # regions whose boxes all share their dims-1/2 extent, as in every 1-D region:
    # (lo1, lo2, hi1, hi2, flat dim-0 boundaries), else False)
    __slots__ = ("_pairs", "dims", "_boxes", "_sf", "_bb", "_fl")

    def __init__(self, boxes: Iterable[Box] = (), dims: int | None = None):
        pairs: list = []
        d = 0
        lone = None  # a single Region argument is taken as is (already normalized)
        nregions = 0
        for b in boxes:
            if isinstance(b, Region):
                nregions += 1
                lone = b
                pairs.extend(b._pairs)
                if b.dims > d:
                    d = b.dims
                continue
            if not isinstance(b, Box):
                raise TypeError(f"Region takes Box objects, got {type(b).__name__}")
            if b.dims > d:
                d = b.dims
            if not b.empty:
                pairs.append((b.lo, b.hi))
        if nregions == 1 and len(pairs) == len(lone._pairs):
            self._pairs = lone._pairs
            self._sf = lone._sf
            self._bb = lone._bb
            self._fl = lone._fl
        else:
            self._pairs = _normalize(pairs)
            self._sf = None
            self._bb = None
            self._fl = None
        self.dims = d if dims is None else dims
        self._boxes = None

    @classmethod
    def _from_pairs(cls, pairs, dims: int, normalized: bool = False) -> "Region":
        r = object.__new__(cls)
        if normalized:
            r._pairs = tuple(pairs)
        else:
            r._pairs = _normalize(pairs if isinstance(pairs, (list, tuple)) else list(pairs))
        r.dims = dims
        r._boxes = None
        r._sf = None
        r._bb = None
        r._fl = None
        return r

    @classmethod
    def _from_sf(cls, sf: list, dims: int) -> "Region":
        r = object.__new__(cls)
        r._pairs = _from_sf(sf)
        r.dims = dims
        r._boxes = None
        r._sf = sf
        r._bb = None
        r._fl = None
        return r

    @classmethod
    def _from_flat(cls, fl: tuple, dims: int) -> "Region":
        r = object.__new__(cls)
        l1, l2, h1, h2, flat = fl
        r._pairs = tuple([((flat[i], l1, l2), (flat[i + 1], h1, h2)) for i in range(0, len(flat), 2)])
        r.dims = dims
        r._boxes = None
        r._sf = None
        r._bb = None
        r._fl = fl
        return r

    def _flat(self):
        """(lo1, lo2, hi1, hi2, [a0, b0, a1, b1, ...]) when all boxes share their extent
        in dims 1 and 2 (the region is 1-D along dim 0), else False. Non-empty only."""
        fl = self._fl
        if fl is None:
            p = self._pairs
            l, h = p[0]
            l1, l2, h1, h2 = l[1], l[2], h[1], h[2]
            flat = []
            for l, h in p:
                if l[1] != l1 or h[1] != h1 or l[2] != l2 or h[2] != h2:
                    fl = False
                    break
                flat.append(l[0])
                flat.append(h[0])
            else:
                fl = (l1, l2, h1, h2, flat)
            self._fl = fl
        return fl

    def _with_dims(self, dims: int) -> "Region":
        if dims == self.dims:
            return self
        r = object.__new__(Region)
        r._pairs = self._pairs
        r.dims = dims
        r._boxes = None
        r._sf = self._sf
        r._bb = self._bb
        r._fl = self._fl
        return r

    def _get_sf(self) -> list:
        sf = self._sf
        if sf is None:
            sf = self._sf = _to_sf(self._pairs)
        return sf

    def _bounds(self) -> tuple:
        """(lo, hi) 3-tuples of the bounding box of a non-empty region (cached)."""
        bb = self._bb
        if bb is None:
            bb = self._bb = _pairs_bounds(self._pairs)
        return bb

    @classmethod
    def from_box(cls, box: Box) -> "Region":
        return cls._from_pairs(() if box.empty else ((box.lo, box.hi),), box.dims, True)

    @classmethod
    def empty_region(cls, dims: int = 0) -> "Region":
        return cls._from_pairs((), dims, True)

    @property
    def boxes(self) -> tuple[Box, ...]:
        if self._boxes is None:
            d = self.dims
            self._boxes = tuple(Box._make(lo, hi, d) for lo, hi in self._pairs)
        return self._boxes

    def __iter__(self) -> Iterator[Box]:
        return iter(self.boxes)

    def __len__(self) -> int:
        return len(self._pairs)

    @property
    def empty(self) -> bool:
        return not self._pairs

    def __bool__(self) -> bool:
        return bool(self._pairs)

    @property
    def area(self) -> int:
        return sum((h[0] - l[0]) * (h[1] - l[1]) * (h[2] - l[2]) for l, h in self._pairs)

    @property
    def bounding_box(self) -> Box:
        if not self._pairs:
            return _empty_box(self.dims)
        lo, hi = self._bounds()
        return Box._make(lo, hi, self.dims)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Region):
            return self._pairs == other._pairs
        if isinstance(other, Box):
            p = self._pairs
            if other.empty:
                return not p
            return len(p) == 1 and p[0][0] == other.lo and p[0][1] == other.hi
        return NotImplemented

    def __hash__(self) -> int:
        # consistent with Box.__hash__, since a one-box region equals its box
        p = self._pairs
        if len(p) == 1:
            return hash(p[0])
        if not p:
            return hash((_EMPTY_LO, _EMPTY_HI))
        return hash(p)

    def __repr__(self) -> str:
        return "Region(" + ", ".join(f"[{list(b.min)}, {list(b.max)}]" for b in self.boxes) + ")"

    # ------------------------------------------------------------------ set algebra
    # Each operation tries, in order: trivial operands; single boxes (a box minus a
    # box is already canonical once sorted); regions that are 1-D along dim 0 with
    # the same extent in dims 1/2 (a flat interval sweep); the general step-function
    # sweep.  Results keep whatever cached form the operation produced.

    def union(self, other: "Region | Box") -> "Region":
        p = self._pairs
        if isinstance(other, Box):
            d = self.dims if self.dims >= other.dims else other.dims
            if other.empty:
                return self._with_dims(d)
            olo, ohi = other.lo, other.hi
        elif isinstance(other, Region):
            d = self.dims if self.dims >= other.dims else other.dims
            op = other._pairs
            if not op or op == p:
                return self._with_dims(d)
            if not p:
                return other._with_dims(d)
            if len(op) > 1:
                if len(p) == 1:
                    return other.union(self)
                fl = self._flat()
                if fl:
                    ofl = other._flat()
                    if ofl and fl[:4] == ofl[:4]:
                        return Region._from_flat(fl[:4] + (_op2(fl[4], ofl[4], _OR),), d)
                return Region._from_sf(_op0(self._get_sf(), other._get_sf(), _OR), d)
            olo, ohi = op[0]
        else:
            raise TypeError(f"expected Region or Box, got {type(other).__name__}")
        # union with one box (olo, ohi)
        if not p:
            return Region._from_pairs(((olo, ohi),), d, True)
        if len(p) == 1:
            a0, a1 = p[0]
            if (a0[0] <= olo[0] and ohi[0] <= a1[0] and a0[1] <= olo[1] and ohi[1] <= a1[1]
                    and a0[2] <= olo[2] and ohi[2] <= a1[2]):
                return self._with_dims(d)
            if (olo[0] <= a0[0] and a1[0] <= ohi[0] and olo[1] <= a0[1] and a1[1] <= ohi[1]
                    and olo[2] <= a0[2] and a1[2] <= ohi[2]):
                return Region._from_pairs(((olo, ohi),), d, True)
            if a0[1] == olo[1] and a0[2] == olo[2] and a1[1] == ohi[1] and a1[2] == ohi[2]:
                # same extent in dims 1/2: an interval union along dim 0
                if a1[0] < olo[0]:
                    return Region._from_pairs(((a0, a1), (olo, ohi)), d, True)
                if ohi[0] < a0[0]:
                    return Region._from_pairs(((olo, ohi), (a0, a1)), d, True)
                lo = a0 if a0[0] <= olo[0] else olo
                hi = a1 if a1[0] >= ohi[0] else ohi
                return Region._from_pairs(((lo, hi),), d, True)
        fl = self._flat()
        if fl and fl[0] == olo[1] and fl[1] == olo[2] and fl[2] == ohi[1] and fl[3] == ohi[2]:
            return Region._from_flat(fl[:4] + (_op2(fl[4], [olo[0], ohi[0]], _OR),), d)
        return Region._from_sf(_op0(self._get_sf(), _box_sf(olo, ohi), _OR), d)

    __or__ = union
    __ror__ = union

    def intersection(self, other: "Region | Box") -> "Region":
        p = self._pairs
        if isinstance(other, Box):
            d = self.dims if self.dims >= other.dims else other.dims
            if other.empty or not p:
                return Region._from_pairs((), d, True)
            return _clip(self, p, other.lo, other.hi, d)
        if not isinstance(other, Region):
            raise TypeError(f"expected Region or Box, got {type(other).__name__}")
        d = self.dims if self.dims >= other.dims else other.dims
        op = other._pairs
        if not op or not p:
            return Region._from_pairs((), d, True)
        if len(op) == 1:
            return _clip(self, p, op[0][0], op[0][1], d)
        if len(p) == 1:
            return _clip(other, op, p[0][0], p[0][1], d)
        if op == p:
            return self._with_dims(d)
        fl = self._flat()
        if fl:
            ofl = other._flat()
            if ofl and fl[:4] == ofl[:4]:
                return Region._from_flat(fl[:4] + (_op2(fl[4], ofl[4], _AND),), d)
        if len(p) * len(op) <= 16 and not _any_overlap(p, op):
            return Region._from_pairs((), d, True)
        return Region._from_sf(_op0(self._get_sf(), other._get_sf(), _AND), d)

    __and__ = intersection
    __rand__ = intersection

    def difference(self, other: "Region | Box") -> "Region":
        p = self._pairs
        if not p:
            return self
        if isinstance(other, Box):
            if other.empty:
                return self
            olo, ohi = other.lo, other.hi
        elif isinstance(other, Region):
            op = other._pairs
            if not op:
                return self
            if len(op) > 1:
                if op == p:
                    return Region._from_pairs((), self.dims, True)
                fl = self._flat()
                if fl:
                    ofl = other._flat()
                    if ofl and fl[:4] == ofl[:4]:
                        res = _op2(fl[4], ofl[4], _SUB)
                        return self if res is fl[4] else Region._from_flat(fl[:4] + (res,), self.dims)
                if len(p) * len(op) <= 16 and not _any_overlap(p, op):
                    return self
                return Region._from_sf(_op0(self._get_sf(), other._get_sf(), _SUB), self.dims)
            olo, ohi = op[0]
        else:
            raise TypeError(f"expected Region or Box, got {type(other).__name__}")
        if len(p) == 1:
            a0, a1 = p[0]
            if _isect(a0, a1, olo, ohi) is None:
                return self
            pieces: list = []
            _box_minus(a0, a1, olo, ohi, pieces)
            pieces.sort()
            return Region._from_pairs(pieces, self.dims, True)
        if len(p) <= 8:
            for a0, a1 in p:
                if _isect(a0, a1, olo, ohi) is not None:
                    break
            else:
                return self
        else:
            blo, bhi = self._bounds()
            if _isect(blo, bhi, olo, ohi) is None:
                return self
        fl = self._flat()
        if fl:
            if fl[0] >= olo[1] and fl[1] >= olo[2] and fl[2] <= ohi[1] and fl[3] <= ohi[2]:
                # the box spans the region's whole extent in dims 1/2: a 1-D difference
                res = _op2(fl[4], [olo[0], ohi[0]], _SUB)
                return self if res is fl[4] else Region._from_flat(fl[:4] + (res,), self.dims)
        return Region._from_sf(_op0(self._get_sf(), _box_sf(olo, ohi), _SUB), self.dims)

    __sub__ = difference

    def __rsub__(self, other: "Box") -> "Region":
        if isinstance(other, Box):
            return Region.from_box(other).difference(self)
        return NotImplemented

    def intersects(self, other: "Region | Box") -> bool:
        p = self._pairs
        if not p:
            return False
        if isinstance(other, Box):
            if other.empty:
                return False
            b0, b1 = other.lo, other.hi
            for a0, a1 in p:
                if (a0[0] < b1[0] and b0[0] < a1[0] and a0[1] < b1[1] and b0[1] < a1[1]
                        and a0[2] < b1[2] and b0[2] < a1[2]):
                    return True
            return False
        op = _pairs_of(other)
        if not op:
            return False
        if len(p) * len(op) <= 64:
            for b0, b1 in op:
                for a0, a1 in p:
                    if (a0[0] < b1[0] and b0[0] < a1[0] and a0[1] < b1[1] and b0[1] < a1[1]
                            and a0[2] < b1[2] and b0[2] < a1[2]):
                        return True
            return False
        blo, bhi = self._bounds()
        olo, ohi = other._bounds()
        if _isect(blo, bhi, olo, ohi) is None:
            return False
        return bool(_op0(self._get_sf(), other._get_sf(), _AND))

    def contains(self, other: "Region | Box | Sequence[int]") -> bool:
        if isinstance(other, Box):
            if other.empty:
                return True
            return _covers(self._pairs, other.lo, other.hi)
        if isinstance(other, Region):
            op = other._pairs
            if not op:
                return True
            p = self._pairs
            if len(op) == 1:
                return _covers(p, op[0][0], op[0][1])
            if not p:
                return False
            return not _op0(other._get_sf(), self._get_sf(), _SUB)
        q = _pad(tuple(other), 0)
        for l, h in self._pairs:
            if l[0] <= q[0] < h[0] and l[1] <= q[1] < h[1] and l[2] <= q[2] < h[2]:
                return True
        return False

    def __contains__(self, other) -> bool:
        return self.contains(other)

    def with_dims(self, dims: int) -> "Region":
        return self._with_dims(dims)

    def to_json(self) -> list:
        return [b.to_json() for b in self.boxes]


def _any_overlap(p, q) -> bool:
    for b0, b1 in q:
        for a0, a1 in p:
            if (a0[0] < b1[0] and b0[0] < a1[0] and a0[1] < b1[1] and b0[1] < a1[1]
                    and a0[2] < b1[2] and b0[2] < a1[2]):
                return True
    return False


def _covers(p, b0, b1) -> bool:
    """Whether the disjoint boxes ``p`` cover the non-empty box (b0, b1): by area."""
    need = (b1[0] - b0[0]) * (b1[1] - b0[1]) * (b1[2] - b0[2])
    for a0, a1 in p:
        l0 = a0[0] if a0[0] > b0[0] else b0[0]
        h0 = a1[0] if a1[0] < b1[0] else b1[0]
        if h0 <= l0:
            continue
        l1 = a0[1] if a0[1] > b0[1] else b0[1]
        h1 = a1[1] if a1[1] < b1[1] else b1[1]
        if h1 <= l1:
            continue
        l2 = a0[2] if a0[2] > b0[2] else b0[2]
        h2 = a1[2] if a1[2] < b1[2] else b1[2]
        if h2 <= l2:
            continue
        need -= (h0 - l0) * (h1 - l1) * (h2 - l2)
        if need == 0:
            return True
    return False


def _clip(r: Region, p: tuple, b0, b1, d: int) -> Region:
    """``r & box`` for a normalized region ``r`` with pairs ``p`` and a non-empty box."""
    out = []
    changed = False
    for a0, a1 in p:
        x = _isect(a0, a1, b0, b1)
        if x is None:
            changed = True
        else:
            if not changed and (x[0] != a0 or x[1] != a1):
                changed = True
            out.append(x)
    if not changed:
        return r._with_dims(d)
    if len(out) <= 1 or r._fl or not _touching(out):
        return Region._from_pairs(out, d, True)
    # clipping keeps the slab structure but may make touching slabs equal: re-merge
    return Region._from_sf(_to_sf(out), d)


def _touching(p) -> bool:
    """Whether sorted, canonically grouped pairs have touching dim-0 slabs or touching
    dim-1 groups inside a slab: the only places where clipping can require a merge (a
    clipped region that is 1-D along dim 0, for one, never needs one)."""
    pl, ph = p[0]
    for lo, hi in p:
        if lo[0] == pl[0]:
            if lo[1] != pl[1] and lo[1] == ph[1]:
                return True
        elif lo[0] == ph[0]:
            return True
        pl, ph = lo, hi
    return False


def _pairs_of(x: "Region | Box") -> tuple:
    if isinstance(x, Region):
        return x._pairs
    if isinstance(x, Box):
        return () if x.empty else ((x.lo, x.hi),)
    raise TypeError(f"expected Region or Box, got {type(x).__name__}")


def _as_region(x: "Region | Box") -> Region:
    return x if isinstance(x, Region) else Region.from_box(x)


def as_region(x: "Region | Box | Iterable[Box]") -> Region:
    if isinstance(x, Region):
        return x
    if isinstance(x, Box):
        return Region.from_box(x)
    return Region(x)


class Subrange:
    """``offset`` + ``range`` view of a box, the form range mappers receive and return."""

    __slots__ = ("offset", "range")

    def __init__(self, offset: Sequence[int], range: Sequence[int]):
        if len(offset) != len(range):
            raise ValueError(f"subrange offset {tuple(offset)} and range {tuple(range)} differ in dimensionality")
        self.offset = tuple(int(o) for o in offset)
        self.range = tuple(int(r) for r in range)

    @property
    def dims(self) -> int:
        return len(self.offset)

    @property
    def box(self) -> Box:
        return Box.from_subrange(self.offset, self.range)

    @property
    def min(self) -> tuple[int, ...]:
        return self.offset

    @property
    def max(self) -> tuple[int, ...]:
        return tuple(o + r for o, r in zip(self.offset, self.range))

    @classmethod
    def from_box(cls, box: Box) -> "Subrange":
        return cls(box.offset, box.range)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Subrange):
            return self.offset == other.offset and self.range == other.range
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.offset, self.range))

    def __repr__(self) -> str:
        return f"Subrange(offset={self.offset}, range={self.range})"


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
        mk = Box._make
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

    def __len__(self) -> int:
        """Number of boxes of the canonical decomposition (per value)."""
        self._compact()
        return len(self._entries)


_itemgetter0 = itemgetter(0)
