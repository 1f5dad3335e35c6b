"""Boxes and subranges: the unit of every region computation.

Everything is stored as 3-D (unused dimensions span ``[0, 1)``) so that the
arithmetic has a single code path; ``dims`` only decides how a box is shown to
the user.  ``lo``/``hi`` are those padded 3-tuples: public, read-only, and what the
scheduler's hot paths compare directly.
"""
from __future__ import annotations

from operator import index as _index
from typing import TYPE_CHECKING, Sequence

from ..errors import GeometryError

if TYPE_CHECKING:
    from .region import Region

_EMPTY_LO = (0, 0, 0)
_EMPTY_HI = (0, 0, 0)
_UNIT_HI = (1, 1, 1)


def _pad(values: Sequence[int], fill: int) -> tuple[int, int, int]:
    try:
        n = len(values)
        if n == 3:
            return (_index(values[0]), _index(values[1]), _index(values[2]))
        if n == 2:
            return (_index(values[0]), _index(values[1]), fill)
        if n == 1:
            return (_index(values[0]), fill, fill)
    except TypeError:
        raise GeometryError(f"coordinates {values!r} must be integers (a float is not truncated)") from None
    if n == 0:
        return (0, 0, 0) if fill == 0 else (1, 1, 1)
    raise GeometryError(f"at most 3 dimensions are supported, got {n}")


def as_ints(values, what: str, error: type = GeometryError, scalar: bool = False) -> tuple[int, ...]:
    """``values`` as a tuple of ints (numpy integers included; with ``scalar`` one integer
    too); anything else, a float that would be truncated among them, raises ``error`` naming
    ``what``.  Shared by the geometry, buffer shapes and kernel ranges, each with its error."""
    if scalar:
        try:
            return (_index(values),)
        except TypeError:
            pass
    try:
        return tuple([_index(v) for v in values])
    except TypeError:
        raise error(f"{what} {values!r} must be {'an integer or ' if scalar else ''}a sequence of integers") from None


_new_object = object.__new__


class Box:
    """A half-open box ``[min, max)``; every empty box is the same box."""

    __slots__ = ("lo", "hi", "dims", "_h")   # (_h: the hash, set at first use)

    def __init__(self, min: Sequence[int] = (), max: Sequence[int] = (), dims: int | None = None):
        try:
            n = len(min)
            different = len(max) != n
        except TypeError:
            raise GeometryError(f"box min and max must be sequences of integers, got {min!r} and {max!r}") from None
        if different:
            raise GeometryError(f"box min {tuple(min)} and max {tuple(max)} differ in dimensionality")
        if dims is None:
            dims = n
        lo = _pad(min, 0)
        hi = _pad(max, 1)
        if hi[0] <= lo[0] or hi[1] <= lo[1] or hi[2] <= lo[2]:
            lo, hi = _EMPTY_LO, _EMPTY_HI
        self.lo = lo
        self.hi = hi
        self.dims = dims

    @staticmethod
    def from_bounds(lo: tuple[int, int, int], hi: tuple[int, int, int], dims: int) -> "Box":
        """A box from padded, non-empty 3-tuples, as ``lo``/``hi`` hold them.  No checks:
        the generators build boxes from bounds they computed themselves, thousands per task
        (a static method: no bound classmethod made per call)."""
        b = _new_object(Box)
        b.lo = lo
        b.hi = hi
        b.dims = dims
        return b

    _make = from_bounds

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
        return _empty_box(dims) if self.empty else Box.from_bounds(self.lo, self.hi, dims)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Box):
            return NotImplemented
        return self.lo == other.lo and self.hi == other.hi

    def __hash__(self) -> int:
        try:
            return self._h
        except AttributeError:   # (the first time: boxes key the generators' memos)
            h = self._h = hash((self.lo, self.hi))
            return h

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
        return Box.from_bounds(r[0], r[1], dims)

    def __or__(self, other: "Box | Region") -> "Region":
        """Union as a Region (box | box, box | region)."""
        if isinstance(other, Box):
            from .region import Region
            return Region.from_box(self).union(other)
        return NotImplemented

    def __sub__(self, other: "Box | Region") -> "Region":
        """Difference as a Region (box - box, box - region)."""
        if isinstance(other, Box):
            from .region import Region
            return Region.from_box(self).difference(other)
        return NotImplemented

    def contains_box(self, other: "Box") -> bool:
        """``contains`` for a box argument without the type dispatch: the allocation
        lookups ask it for every access of every command."""
        o0, o1 = other.lo, other.hi
        if o1[0] <= o0[0]:   # the empty box
            return True
        lo, hi = self.lo, self.hi
        return (lo[0] <= o0[0] and o1[0] <= hi[0] and lo[1] <= o0[1] and o1[1] <= hi[1]
                and lo[2] <= o0[2] and o1[2] <= hi[2])

    def contains(self, other: "Box | Region | Sequence[int]") -> bool:
        """Whether a box, a region (exactly: a region lies in a box iff its bounding box
        does) or a point lies inside this box."""
        lo, hi = self.lo, self.hi
        if type(other) is Box or isinstance(other, Box):
            o0, o1 = other.lo, other.hi
            if o1[0] <= o0[0]:   # the empty box
                return True
            return (lo[0] <= o0[0] and o1[0] <= hi[0] and lo[1] <= o0[1] and o1[1] <= hi[1]
                    and lo[2] <= o0[2] and o1[2] <= hi[2])
        bounds = getattr(other, "bounds", None)
        if bounds is not None:   # a Region
            if not other:
                return True
            o0, o1 = bounds
            return (lo[0] <= o0[0] and o1[0] <= hi[0] and lo[1] <= o0[1] and o1[1] <= hi[1]
                    and lo[2] <= o0[2] and o1[2] <= hi[2])
        p = _pad(tuple(other), 0)
        return lo[0] <= p[0] < hi[0] and lo[1] <= p[1] < hi[1] and lo[2] <= p[2] < hi[2]

    def __contains__(self, other: "Box | Sequence[int]") -> bool:
        return self.contains(other)

    def touches(self, other: "Box") -> bool:
        """Whether the boxes overlap or share a face (1-D: an end point; 2-D: part of an
        edge; 3-D: part of a face), so that together they are one connected piece: what
        decides that two accesses are allocated as one.  Boxes meeting only at a corner,
        or in 3-D along an edge, do not touch (Celerity's 2/4/6-connectivity)."""
        a0, a1, b0, b1 = self.lo, self.hi, other.lo, other.hi
        if a1[0] <= a0[0] or b1[0] <= b0[0]:
            return False     # (an empty box touches nothing)
        flush = 0
        for d in (0, 1, 2):
            lo = a0[d] if a0[d] > b0[d] else b0[d]
            hi = a1[d] if a1[d] < b1[d] else b1[d]
            if hi < lo:
                return False
            if hi == lo:
                flush += 1
        return flush <= 1

    def indices_meeting(self, regions: Sequence["Region"]) -> list[int]:
        """Indices of the non-empty regions whose bounding box intersects this box, in
        order.  One call instead of a test per region: the command graph asks it per
        buffer and task about every rank's chunk, so it is a loop in here, not there."""
        a0, a1 = self.lo, self.hi
        if a1[0] <= a0[0]:
            return []
        x0, y0, z0 = a0
        x1, y1, z1 = a1
        out = []
        for i, r in enumerate(regions):
            if not r._pairs:   # (the package's own fields: no call per region)
                continue
            b0, b1 = r._bb or r.bounds
            if b0[0] < x1 and x0 < b1[0] and b0[1] < y1 and y0 < b1[1] and b0[2] < z1 and z0 < b1[2]:
                out.append(i)
        return out

    def bounding(self, other: "Box") -> "Box":
        if self.empty:
            return other
        if other.empty:
            return self
        a0, a1, b0, b1 = self.lo, self.hi, other.lo, other.hi
        return Box.from_bounds((min(a0[0], b0[0]), min(a0[1], b0[1]), min(a0[2], b0[2])),
                         (max(a1[0], b1[0]), max(a1[1], b1[1]), max(a1[2], b1[2])),
                         max(self.dims, other.dims))

    def grown_over(self, others: Sequence["Box"], touching: bool = False) -> "Box":
        """This box grown by every box of ``others`` it overlaps (with ``touching``: also
        shares a face with) and does not hold, until it meets none it does not hold: an
        allocation grown over what is allocated along with it."""
        box = self
        grown = True
        while grown:
            grown = False
            for o in others:
                if (box.touches(o) if touching else box.intersects(o)) and not box.contains_box(o):
                    box = box.bounding(o)
                    grown = True
        return box

    @staticmethod
    def touching_groups(boxes: Sequence["Box"]) -> tuple["Box", ...]:
        """What must be allocated contiguously for ``boxes`` (empty ones dropped), ordered by
        low corner: the bounding box of each connected piece (boxes that ``touch``,
        transitively), those bounding boxes merged where they overlap, since allocations of
        one buffer do not overlap.  Two accessors reading the two ends of a buffer need two
        small allocations, not their bounding box, as in Celerity."""
        if len(boxes) == 1:
            b = boxes[0]
            return () if b.empty else (b,)
        live = [b for b in boxes if not b.empty]
        n = len(live)
        parent = list(range(n))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for i in range(n):
            for j in range(i + 1, n):
                if live[i].touches(live[j]):
                    parent[root(i)] = root(j)
        pieces: dict[int, Box] = {}
        for i, b in enumerate(live):
            r = root(i)
            have = pieces.get(r)
            pieces[r] = b if have is None else have if have.contains_box(b) else have.bounding(b)
        out: list[Box] = []
        for b in pieces.values():
            merged = True
            while merged:           # (a grown box may now overlap one it did not before)
                merged = False
                for i, o in enumerate(out):
                    if o.intersects(b):
                        b = b if b.contains_box(o) else b.bounding(o)
                        del out[i]
                        merged = True
                        break
            out.append(b)
        if len(out) > 1:
            out.sort(key=lambda x: x.lo)
        return tuple(out)

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


class Subrange:
    """``offset`` + ``range`` view of a box, the form range mappers receive and return."""

    __slots__ = ("offset", "range")

    def __init__(self, offset: Sequence[int], range: Sequence[int]):
        offset = as_ints(offset, "subrange offset")
        range = as_ints(range, "subrange range")
        if len(offset) != len(range):
            raise GeometryError(f"subrange offset {offset} and range {range} differ in dimensionality")
        if len(offset) > 3:
            raise GeometryError(f"at most 3 dimensions are supported, got {len(offset)}")
        for r in range:
            if r < 0:
                raise GeometryError(f"subrange range {range} has a negative extent")
        self.offset = offset
        self.range = range

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
