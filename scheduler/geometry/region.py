"""Normalized regions: exact set algebra on disjoint boxes.

The hot paths work on plain tuples of ints: no numpy per operation, because the
scheduler does thousands of these per task.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

from ..errors import GeometryError
from .box import _EMPTY_HI, _EMPTY_LO, Box, _box_minus, _empty_box, _isect, _pad

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
    __slots__ = ("_pairs", "dims", "_boxes", "_sf", "_bb", "_fl", "_h")

    def __init__(self, boxes: Iterable[Box] = (), dims: int | None = None):
        pairs: list = []
        d = 0
        lone = None  # a single Region argument is taken as is (already normalized)
        nregions = 0
        nd = -1     # the dimensionality of the non-empty boxes so far (-1: none yet)
        for b in boxes:
            if isinstance(b, Region):
                nregions += 1
                lone = b
                pairs.extend(b._pairs)
                nonempty = bool(b._pairs)
            elif isinstance(b, Box):
                nonempty = not b.empty
                if nonempty:
                    pairs.append((b.lo, b.hi))
            else:
                raise GeometryError(f"Region takes Box objects, got {type(b).__name__}")
            if b.dims > d:
                d = b.dims
            # (boxes are stored padded to 3-D: a 1-D box among 2-D ones would silently mean a
            # one-wide 2-D box)
            if nonempty and nd != b.dims:
                if nd >= 0:
                    _mixed_dims(nd, b)
                nd = b.dims
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

    # ---- public fast paths (the generators' hot loops use these instead of building Boxes)
    @property
    def bounds(self) -> tuple:
        """``(lo, hi)`` 3-tuples of the bounding box (cached); ``((0, 0, 0), (0, 0, 0))``
        for the empty region."""
        bb = self._bb
        if bb is None:
            bb = self._bb = _pairs_bounds(self._pairs) if self._pairs else (_EMPTY_LO, _EMPTY_HI)
        return bb

    @property
    def corners(self) -> tuple:
        """The canonical decomposition as ``((lo, hi), ...)`` 3-tuple pairs: sorted,
        disjoint, one representation per point set (so it is a hashable identity)."""
        return self._pairs

    @classmethod
    def from_corners(cls, pairs, dims: int, normalized: bool = False) -> "Region":
        """A region from ``(lo, hi)`` 3-tuple pairs of non-empty boxes; ``normalized``
        promises they already are a canonical decomposition (as ``corners`` returns)."""
        return cls._from_pairs(pairs, dims, normalized)

    def as_box(self) -> Box | None:
        """The region as one box if it is exactly one (non-empty) box, else None."""
        p = self._pairs
        if len(p) != 1:
            return None
        return self.boxes[0]

    def bounds_intersect(self, other: "Region | Box") -> bool:
        """Whether the bounding boxes meet: a cheap necessary test for ``intersects``
        (hot path: the command graph asks it once per rank and buffer of every task)."""
        p = self._pairs
        if not p:
            return False
        bb = self._bb
        if bb is None:
            bb = self._bb = _pairs_bounds(p)
        a0, a1 = bb
        if type(other) is Box:
            b0, b1 = other.lo, other.hi
            if b1[0] <= b0[0]:   # the empty box
                return False
        else:
            q = other._pairs
            if not q:
                return False
            b1 = other._bb
            if b1 is None:
                b1 = other._bb = _pairs_bounds(q)
            b0, b1 = b1
        return (a0[0] < b1[0] and b0[0] < a1[0] and a0[1] < b1[1] and b0[1] < a1[1]
                and a0[2] < b1[2] and b0[2] < a1[2])

    @classmethod
    def from_box(cls, box: Box) -> "Region":
        return cls._from_pairs(() if box.empty else ((box.lo, box.hi),), box.dims, True)

    @classmethod
    def empty_region(cls, dims: int = 0) -> "Region":
        return cls._from_pairs((), dims, True)

    def sole_bounds(self) -> tuple | None:
        """``(lo, hi)`` of the region's one box (3-D padded, as ``Box.lo`` / ``Box.hi``), or None
        when it has none or several: lets a hot path compare a box with a one-box region
        (a halo receive and the one pilot that announces it) without region arithmetic."""
        p = self._pairs
        return p[0] if len(p) == 1 else None

    @property
    def boxes(self) -> tuple[Box, ...]:
        if self._boxes is None:
            d = self.dims
            self._boxes = tuple(Box.from_bounds(lo, hi, d) for lo, hi in self._pairs)
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
        return Box.from_bounds(lo, hi, self.dims)

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
        # consistent with Box.__hash__, since a one-box region equals its box; cached (in
        # a slot set on first use: regions are immutable, and replay keys hash them often)
        try:
            return self._h
        except AttributeError:
            pass
        p = self._pairs
        if len(p) == 1:
            h = hash(p[0])
        elif not p:
            h = hash((_EMPTY_LO, _EMPTY_HI))
        else:
            h = hash(p)
        self._h = h
        return h

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
            if a0 == olo and a1 == ohi:     # (the box is the region: a receive of exactly one message's box)
                return Region._from_pairs((), self.dims, True)
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
            o0, o1 = other.lo, other.hi
            if o1[0] <= o0[0]:      # (the empty box)
                return True
            p = self._pairs
            if len(p) == 1:         # (a receive's region, matched against a pilot's box)
                a0, a1 = p[0]
                return (a0[0] <= o0[0] and o1[0] <= a1[0] and a0[1] <= o0[1] and o1[1] <= a1[1]
                        and a0[2] <= o0[2] and o1[2] <= a1[2])
            return _covers(p, o0, o1)
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


def _mixed_dims(dims: int, b: "Box | Region") -> None:
    raise GeometryError(f"a Region's boxes must share one dimensionality: {b!r} is {b.dims}-D, "
                        f"the boxes before it {dims}-D")


def _as_region(x: "Region | Box") -> Region:
    return x if isinstance(x, Region) else Region.from_box(x)


def as_region(x: "Region | Box | Iterable[Box]") -> Region:
    if isinstance(x, Region):
        return x
    if isinstance(x, Box):
        return Region.from_box(x)
    return Region(x)


def split_overlapping(regions: Iterable[Region]) -> list[Region]:
    """Pairwise disjoint, non-empty regions such that each non-empty input is the union of
    some of them (and no output partly overlaps any input): the parts of concurrent
    readers' regions that each can wait for on its own.  Receiving the readers' regions one
    after the other, each taking what the readers before it did not, makes a later reader
    wait for an earlier reader's whole part, data it may not read; receiving these parts
    instead, a reader waits for exactly what it reads (Celerity splits concurrent receive
    and copy regions the same way).  Duplicates give one part, disjoint inputs themselves;
    the order follows the inputs'.  Empty inputs are skipped."""
    parts: list[Region] = []
    for r in regions:
        rest = r
        if not rest:
            continue
        out: list[Region] = []
        for a in parts:
            if rest and a.intersects(rest):
                common = a & rest
                if common == a:
                    out.append(a)
                else:       # a splits into what lies outside r and what r shares with it
                    out.append(a - common)
                    out.append(common)
                rest = rest - common
            else:
                out.append(a)
        if rest:
            out.append(rest)
        parts = out
    return parts
