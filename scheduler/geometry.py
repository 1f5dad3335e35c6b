"""Exact region arithmetic: boxes, normalized regions and region maps.

Everything is stored as 3-D (unused dimensions span ``[0, 1)``) so that the
arithmetic has a single code path; ``dims`` only decides how a box is shown to
the user.  The hot paths work on plain tuples of ints: no numpy per operation,
because the scheduler does thousands of these per task.
"""
from __future__ import annotations

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
        return tuple(slice(lo[i] - o[i], hi[i] - o[i]) for i in range(self.dims))

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
        r = _isect(self.lo, self.hi, other.lo, other.hi)
        dims = max(self.dims, other.dims)
        if r is None:
            return _empty_box(dims)
        return Box._make(r[0], r[1], dims)

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
    """Append the (at most 6) disjoint pieces of box a outside box b to ``out``."""
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


def _merge_intervals(ivs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    ivs.sort()
    out: list[tuple[int, int]] = []
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


def _canon(boxes: list, d: int) -> list:
    """Canonical disjoint decomposition of possibly overlapping boxes over dims d..2.

    Boxes are pairs of tuples covering dims d..2. The result is unique per point set:
    slabs along dimension d where the cross-section (recursively canonical) is constant,
    adjacent slabs with equal cross-sections merged. This maximizes extents along the
    fastest (last) dimension first, and comes out sorted.
    """
    if d == 2:
        return [((lo,), (hi,)) for lo, hi in _merge_intervals([(b[0][0], b[1][0]) for b in boxes])]
    first = boxes[0]
    rest_lo, rest_hi = first[0][1:], first[1][1:]
    same_rest = True
    same_head = True
    h_lo, h_hi = first[0][0], first[1][0]
    for lo, hi in boxes:
        if same_rest and (lo[1:] != rest_lo or hi[1:] != rest_hi):
            same_rest = False
        if same_head and (lo[0] != h_lo or hi[0] != h_hi):
            same_head = False
        if not same_rest and not same_head:
            break
    if same_rest:
        # all boxes share their cross-section: a 1-D merge along d
        return [((lo,) + rest_lo, (hi,) + rest_hi)
                for lo, hi in _merge_intervals([(b[0][0], b[1][0]) for b in boxes])]
    if same_head:
        sub = _canon([(lo[1:], hi[1:]) for lo, hi in boxes], d + 1)
        return [((h_lo,) + lo, (h_hi,) + hi) for lo, hi in sub]
    pts = sorted({b[0][0] for b in boxes} | {b[1][0] for b in boxes})
    out: list = []
    slab_lo = None
    slab_hi = None
    slab_cs: list | None = None
    for i in range(len(pts) - 1):
        a, b = pts[i], pts[i + 1]
        sub = [(lo[1:], hi[1:]) for lo, hi in boxes if lo[0] <= a and hi[0] >= b]
        cs = _canon(sub, d + 1) if sub else None
        if cs is not None and slab_cs is not None and cs == slab_cs and slab_hi == a:
            slab_hi = b
            continue
        if slab_cs is not None:
            out.extend(((slab_lo,) + lo, (slab_hi,) + hi) for lo, hi in slab_cs)
        slab_lo, slab_hi, slab_cs = a, b, cs
    if slab_cs is not None:
        out.extend(((slab_lo,) + lo, (slab_hi,) + hi) for lo, hi in slab_cs)
    return out


def _normalize(pairs: list) -> list:
    if len(pairs) <= 1:
        return pairs
    return _canon(pairs, 0)


class Region:
    """A normalized set of disjoint boxes; one representation per point set."""

    __slots__ = ("_pairs", "dims", "_boxes")

    def __init__(self, boxes: Iterable[Box] = (), dims: int | None = None):
        pairs = []
        d = 0
        for b in boxes:
            if isinstance(b, Region):
                pairs.extend(b._pairs)
                d = max(d, b.dims)
                continue
            if not isinstance(b, Box):
                raise TypeError(f"Region takes Box objects, got {type(b).__name__}")
            d = max(d, b.dims)
            if not b.empty:
                pairs.append((b.lo, b.hi))
        self._pairs = tuple(_normalize(pairs))
        self.dims = d if dims is None else dims
        self._boxes = None

    @classmethod
    def _from_pairs(cls, pairs, dims: int, normalized: bool = False) -> "Region":
        r = object.__new__(cls)
        r._pairs = tuple(pairs if normalized else _normalize(list(pairs)))
        r.dims = dims
        r._boxes = None
        return r

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
        p = self._pairs
        if not p:
            return _empty_box(self.dims)
        if len(p) == 1:
            return Box._make(p[0][0], p[0][1], self.dims)
        return Box._make((min(l[0] for l, _ in p), min(l[1] for l, _ in p), min(l[2] for l, _ in p)),
                         (max(h[0] for _, h in p), max(h[1] for _, h in p), max(h[2] for _, h in p)),
                         self.dims)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Box):
            other = Region.from_box(other)
        if not isinstance(other, Region):
            return NotImplemented
        return self._pairs == other._pairs

    def __hash__(self) -> int:
        return hash(self._pairs)

    def __repr__(self) -> str:
        return "Region(" + ", ".join(f"[{list(b.min)}, {list(b.max)}]" for b in self.boxes) + ")"

    def union(self, other: "Region | Box") -> "Region":
        op = _pairs_of(other)
        if not op:
            return self if self.dims >= other.dims else Region._from_pairs(self._pairs, other.dims, True)
        if not self._pairs:
            return Region._from_pairs(op, max(self.dims, other.dims), True)
        return Region._from_pairs(self._pairs + op, max(self.dims, other.dims))

    __or__ = union

    def intersection(self, other: "Region | Box") -> "Region":
        op = _pairs_of(other)
        out = []
        for a0, a1 in self._pairs:
            for b0, b1 in op:
                r = _isect(a0, a1, b0, b1)
                if r is not None:
                    out.append(r)
        return Region._from_pairs(out, max(self.dims, other.dims))

    __and__ = intersection

    def difference(self, other: "Region | Box") -> "Region":
        op = _pairs_of(other)
        cur = list(self._pairs)
        changed = False
        for b0, b1 in op:
            nxt: list = []
            for a0, a1 in cur:
                if _isect(a0, a1, b0, b1) is None:
                    nxt.append((a0, a1))
                else:
                    changed = True
                    _box_minus(a0, a1, b0, b1, nxt)
            cur = nxt
            if not cur:
                break
        if not changed:
            return self
        return Region._from_pairs(cur, self.dims)

    __sub__ = difference

    def intersects(self, other: "Region | Box") -> bool:
        op = _pairs_of(other)
        for a0, a1 in self._pairs:
            for b0, b1 in op:
                if _isect(a0, a1, b0, b1) is not None:
                    return True
        return False

    def contains(self, other: "Region | Box | Sequence[int]") -> bool:
        if isinstance(other, (Region, Box)):
            return not (_as_region(other) - self)
        p = _pad(tuple(other), 0)
        for l, h in self._pairs:
            if l[0] <= p[0] < h[0] and l[1] <= p[1] < h[1] and l[2] <= p[2] < h[2]:
                return True
        return False

    def __contains__(self, other) -> bool:
        return self.contains(other)

    def with_dims(self, dims: int) -> "Region":
        return self if dims == self.dims else Region._from_pairs(self._pairs, dims, True)

    def to_json(self) -> list:
        return [b.to_json() for b in self.boxes]


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


class RegionMap:
    """A value for every point of an extent; values must be hashable.

    Stored as disjoint (box, value) entries; an update replaces the values of a
    region, a query returns (box, value) pairs clipped to the query with equal
    values merged, so callers see as few boxes as the data allows.
    """

    __slots__ = ("extent", "_entries", "dims")

    def __init__(self, extent: Box, default: Any = None):
        self.extent = extent
        self.dims = extent.dims
        self._entries: list[tuple[tuple, tuple, Any]] = [] if extent.empty else [(extent.lo, extent.hi, default)]

    def update(self, where: "Region | Box", value: Any) -> None:
        op = _pairs_of(where)
        if not op:
            return
        ext = self.extent
        clipped = []
        for b0, b1 in op:
            r = _isect(b0, b1, ext.lo, ext.hi)
            if r is not None:
                clipped.append(r)
        if not clipped:
            return
        entries = self._entries
        keep: list = []
        same: list = []
        for e in entries:
            e0, e1, ev = e
            pieces = [(e0, e1)]
            hit = False
            for b0, b1 in clipped:
                nxt: list = []
                for a0, a1 in pieces:
                    if _isect(a0, a1, b0, b1) is None:
                        nxt.append((a0, a1))
                    else:
                        hit = True
                        _box_minus(a0, a1, b0, b1, nxt)
                pieces = nxt
                if not pieces:
                    break
            if ev == value:
                same.extend(pieces)
            elif not hit:
                keep.append(e)
            else:
                keep.extend((a0, a1, ev) for a0, a1 in pieces)
        same.extend(clipped)
        keep.extend((a0, a1, value) for a0, a1 in _normalize(same))
        self._entries = keep

    def query(self, where: "Region | Box | None" = None) -> list[tuple[Box, Any]]:
        """(box, value) pairs covering ``where`` (default: the whole extent)."""
        d = self.dims
        if where is None:
            groups: dict = {}
            for e0, e1, ev in self._entries:
                groups.setdefault(ev, []).append((e0, e1))
        else:
            op = _pairs_of(where)
            groups = {}
            for e0, e1, ev in self._entries:
                for b0, b1 in op:
                    r = _isect(e0, e1, b0, b1)
                    if r is not None:
                        groups.setdefault(ev, []).append(r)
        out = []
        for ev, pairs in groups.items():
            for lo, hi in _normalize(pairs):
                out.append((Box._make(lo, hi, d), ev))
        out.sort(key=lambda bv: (bv[0].lo, bv[0].hi))
        return out

    def query_values(self, where: "Region | Box | None" = None) -> list[tuple[Region, Any]]:
        """Like ``query`` but one (region, value) per distinct value."""
        d = self.dims
        if where is None:
            groups: dict = {}
            for e0, e1, ev in self._entries:
                groups.setdefault(ev, []).append((e0, e1))
        else:
            op = _pairs_of(where)
            groups = {}
            for e0, e1, ev in self._entries:
                for b0, b1 in op:
                    r = _isect(e0, e1, b0, b1)
                    if r is not None:
                        groups.setdefault(ev, []).append(r)
        return [(Region._from_pairs(p, d), ev) for ev, p in groups.items()]

    def region_of(self, predicate) -> Region:
        """The region of all points whose value satisfies ``predicate``."""
        return Region._from_pairs([(e0, e1) for e0, e1, ev in self._entries if predicate(ev)], self.dims)

    def values(self) -> set:
        return {ev for _, _, ev in self._entries}

    def apply(self, where: "Region | Box", fn) -> None:
        """Replace each value v inside ``where`` by ``fn(v)``."""
        for region, v in self.query_values(where):
            self.update(region, fn(v))

    def __len__(self) -> int:
        return len(self._entries)
