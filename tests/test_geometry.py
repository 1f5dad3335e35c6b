"""Property tests for scheduler/geometry/ against a brute-force boolean-mask model.

Every region is compared with a numpy boolean mask over a small coordinate space
(negative coordinates included); the canonical decomposition is recomputed from the
mask independently (slabs along dim 0 whose cross-sections are equal, recursively),
so ``Region.corners`` must match it exactly: one representation per point set.
"""
from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from scheduler.geometry import Box, Region, RegionMap, Subrange, as_region, split_overlapping

# GEOMETRY_EXAMPLES=5000 for a longer local stress run
SETTINGS = settings(max_examples=int(os.environ.get("GEOMETRY_EXAMPLES", 200)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# coordinate space per dimensionality: [LO, HI) in every dimension
SPACE = {1: (-3, 13), 2: (-2, 7), 3: (-1, 4)}
DIMS = [1, 2, 3]


# ----------------------------------------------------------------------------- model
def _shape(d):
    lo, hi = SPACE[d]
    return (hi - lo,) * d


def box_mask(box: Box, d: int) -> np.ndarray:
    m = np.zeros(_shape(d), dtype=bool)
    if box.empty:
        return m
    lo = SPACE[d][0]
    m[tuple(slice(a - lo, b - lo) for a, b in zip(box.min, box.max))] = True
    return m


def region_mask(region, d: int) -> np.ndarray:
    m = np.zeros(_shape(d), dtype=bool)
    for b in region:
        m |= box_mask(b, d)
    return m


def boxes_mask(boxes, d):
    m = np.zeros(_shape(d), dtype=bool)
    for b in boxes:
        m |= box_mask(b, d)
    return m


def _runs(row: np.ndarray):
    out = []
    x = 0
    n = len(row)
    while x < n:
        if row[x]:
            y = x
            while y < n and row[y]:
                y += 1
            out.append((x, y))
            x = y
        else:
            x += 1
    return out


def _canon_mask(m: np.ndarray):
    """Canonical decomposition of a mask, as (lo, hi) tuples in mask coordinates."""
    if m.ndim == 1:
        return [((a,), (b,)) for a, b in _runs(m)]
    out = []
    x = 0
    n = m.shape[0]
    while x < n:
        cs = tuple(_canon_mask(m[x]))
        if not cs:
            x += 1
            continue
        y = x + 1
        while y < n and tuple(_canon_mask(m[y])) == cs:
            y += 1
        out.extend(((x,) + lo, (y,) + hi) for lo, hi in cs)
        x = y
    return out


def canonical_pairs(m: np.ndarray, d: int):
    """The unique normalized ``corners`` of the point set ``m`` (3-D padded, global coords)."""
    lo = SPACE[d][0]
    out = []
    for a, b in _canon_mask(m):
        a = tuple(v + lo for v in a) + (0,) * (3 - d)
        b = tuple(v + lo for v in b) + (1,) * (3 - d)
        out.append((a, b))
    return tuple(out)


def mask_bounding(m: np.ndarray, d: int):
    if not m.any():
        return None
    lo = SPACE[d][0]
    idx = np.nonzero(m)
    return (tuple(int(i.min()) + lo for i in idx), tuple(int(i.max()) + 1 + lo for i in idx))


# ------------------------------------------------------------------------ strategies
@st.composite
def boxes(draw, d: int, allow_empty: bool = True):
    lo_s, hi_s = SPACE[d]
    mins, maxs = [], []
    for _ in range(d):
        a = draw(st.integers(lo_s, hi_s - 1))
        size = draw(st.integers(0 if allow_empty else 1, hi_s - a))
        mins.append(a)
        maxs.append(a + size)
    if allow_empty and draw(st.integers(0, 15)) == 0 and d:
        # an inverted box: also empty
        i = draw(st.integers(0, d - 1))
        mins[i], maxs[i] = maxs[i] + 1, mins[i]
    return Box(tuple(mins), tuple(maxs))


@st.composite
def stripe_lists(draw, d: int, max_size: int = 7):
    """Boxes that all share their extent in dims 1.. (regions that are 1-D along dim 0):
    the flat fast paths of the implementation."""
    if d == 1:
        return draw(st.lists(boxes(1), max_size=max_size))
    lo_s, hi_s = SPACE[d]
    rmin, rmax = [], []
    for _ in range(d - 1):
        a = draw(st.integers(lo_s, hi_s - 1))
        rmin.append(a)
        rmax.append(draw(st.integers(a + 1, hi_s)))
    out = []
    for _ in range(draw(st.integers(0, max_size))):
        a = draw(st.integers(lo_s, hi_s - 1))
        b = draw(st.integers(a, hi_s))
        out.append(Box((a, *rmin), (b, *rmax)))
    return out


def box_lists(d, max_size=7):
    return st.lists(boxes(d), max_size=max_size) | stripe_lists(d, max_size)


def regions(d, max_size=7):
    return box_lists(d, max_size).map(lambda bs: Region(bs, dims=d))


@st.composite
def points(draw, d):
    lo_s, hi_s = SPACE[d]
    return tuple(draw(st.integers(lo_s, hi_s - 1)) for _ in range(d))


@st.composite
def recut(draw, bs, d):
    """A different list of boxes covering the same point set as ``bs``."""
    out = []
    for b in bs:
        if b.empty:
            continue
        pieces = [b]
        for _ in range(draw(st.integers(0, 2))):
            k = draw(st.integers(0, len(pieces) - 1))
            p = pieces[k]
            axis = draw(st.integers(0, d - 1))
            lo, hi = p.min[axis], p.max[axis]
            if hi - lo < 2:
                continue
            cut = draw(st.integers(lo + 1, hi - 1))
            m1, m2 = list(p.max), list(p.min)
            m1[axis] = cut
            m2[axis] = cut
            pieces[k:k + 1] = [Box(p.min, tuple(m1)), Box(tuple(m2), p.max)]
        out.extend(pieces)
        if draw(st.booleans()):
            # a redundant sub-box (overlap does not change the point set)
            lo = [draw(st.integers(a, c - 1)) for a, c in zip(b.min, b.max)]
            hi = [draw(st.integers(a + 1, c)) for a, c in zip(lo, b.max)]
            out.append(Box(tuple(lo), tuple(hi)))
        if draw(st.integers(0, 3)) == 0:
            out.append(Box((5,) * d, (5,) * d))  # an empty box
    return draw(st.permutations(out)) if out else out


# ------------------------------------------------------------------ invariant checks
def check_normalized(r: Region, d: int, m: np.ndarray | None = None):
    pairs = r.corners
    assert isinstance(pairs, tuple)
    for lo, hi in pairs:
        assert len(lo) == 3 and len(hi) == 3
        assert all(type(v) is int for v in lo + hi)
        assert all(a < b for a, b in zip(lo, hi)), "empty box in a region"
        assert lo[d:] == (0,) * (3 - d) and hi[d:] == (1,) * (3 - d)
    assert list(pairs) == sorted(pairs), "boxes not sorted"
    bs = list(r)
    assert len(bs) == len(pairs)
    for b in bs:
        assert not b.empty
        assert b.dims == r.dims
    for a, b in itertools.combinations(bs, 2):
        assert not a.intersects(b), f"{a} and {b} overlap"
    if m is None:
        m = region_mask(r, d)
    assert pairs == canonical_pairs(m, d), "not the canonical decomposition"
    # maximal along the fastest (last) dimension: the cells just past either end
    # of a box along dim d-1 are not in the region
    if d:
        for b in bs:
            for side in (-1, 1):
                lo, hi = list(b.min), list(b.max)
                if side < 0:
                    hi[d - 1] = lo[d - 1]
                    lo[d - 1] -= 1
                else:
                    lo[d - 1] = hi[d - 1]
                    hi[d - 1] += 1
                assert not r.intersects(Box(tuple(lo), tuple(hi))), f"{b} is not maximal along dim {d - 1}"
    # area equals the mask's count for a disjoint decomposition
    assert r.area == int(m.sum())


# ============================================================================== Box
@pytest.mark.parametrize("d", DIMS)
@SETTINGS
@given(data=st.data())
def test_box_ops_match_mask(d, data):
    a = data.draw(boxes(d))
    b = data.draw(boxes(d))
    ma, mb = box_mask(a, d), box_mask(b, d)
    assert a.area == int(ma.sum())
    assert a.empty == (not ma.any())
    assert bool(a) == bool(ma.any())
    assert a.dims == d and len(a.min) == d and len(a.max) == d and len(a.range) == d
    c = a & b
    assert c.dims == d
    assert np.array_equal(box_mask(c, d), ma & mb)
    assert a.intersects(b) == bool((ma & mb).any())
    assert b.intersects(a) == a.intersects(b)
    assert a.contains(b) == (not (mb & ~ma).any())
    assert (b in a) == a.contains(b)
    p = data.draw(points(d))
    lo = SPACE[d][0]
    assert a.contains(p) == bool(ma[tuple(v - lo for v in p)])
    bb = a.bounding(b)
    exp = mask_bounding(ma | mb, d)
    if exp is None:
        assert bb.empty
    else:
        assert (bb.min, bb.max) == exp
    if not a.empty:
        assert a.range == tuple(h - l for l, h in zip(a.min, a.max))
        assert a.offset == a.min
        space = np.zeros(_shape(d), dtype=bool)
        space[tuple(slice(mn - lo, mx - lo) for mn, mx in zip(a.min, a.max))] = True
        assert np.array_equal(space, ma)
        # slices / slices_in index numpy arrays in global / allocation-local coordinates
        arr = np.arange(int(np.prod([SPACE[d][1] + 20] * d))).reshape((SPACE[d][1] + 20,) * d)
        if all(v >= 0 for v in a.min):
            assert arr[a.slices].shape == a.range
        if not b.empty and b.contains(a):
            sub = arr[tuple(slice(x, y) for x, y in zip(b.min, b.max))] if all(v >= 0 for v in b.min) else None
            if sub is not None:
                assert np.array_equal(sub[a.slices_in(b)], arr[a.slices])
        assert a.to_json() == [list(a.min), list(a.max)]
        assert Box.from_subrange(a.offset, a.range) == a
        assert Subrange.from_box(a).box == a


@pytest.mark.parametrize("d", DIMS)
@SETTINGS
@given(data=st.data())
def test_touching_groups_cover_and_separate(d, data):
    """``Box.touching_groups``: every non-empty box lies in exactly one group, groups do not
    overlap, boxes that touch share a group, each group is the bounding box of the boxes in
    it, sorted by low corner."""
    bs = data.draw(st.lists(boxes(d), min_size=1, max_size=6))
    groups = Box.touching_groups(bs)
    live = [b for b in bs if not b.empty]
    assert all(not g.empty for g in groups)
    home = {}
    for k, b in enumerate(live):
        holders = [i for i, g in enumerate(groups) if g.contains(b)]
        assert len(holders) == 1
        home[k] = holders[0]
    for g, h in itertools.combinations(groups, 2):
        assert not g.intersects(h)
    for (i, a), (j, b) in itertools.combinations(enumerate(live), 2):
        if a.touches(b):
            assert home[i] == home[j]
    for g in groups:
        inside = [b for b in live if g.contains(b)]
        bb = inside[0]
        for b in inside[1:]:
            bb = bb.bounding(b)
        assert bb == g
    assert [g.min for g in groups] == sorted(g.min for g in groups)


def test_touching_groups_examples():
    a, b, c = Box((0,), (1,)), Box((1023,), (1024,)), Box((1,), (5,))
    assert Box.touching_groups([a, b]) == (a, b)
    assert Box.touching_groups([b, a]) == (a, b)
    assert Box.touching_groups([a, b, c]) == (Box((0,), (5,)), b)     # a and c share a face
    # (a group grown by one box may then touch another group: they merge)
    x, y, z = Box((0, 0), (2, 2)), Box((4, 0), (6, 2)), Box((2, 0), (4, 1))
    assert Box.touching_groups([x, y, z]) == (Box((0, 0), (6, 2)),)
    # (grown_over: through what it overlaps, or with touching also shares a face with, transitively)
    a = Box((0,), (4,))
    others = [Box((3,), (6,)), Box((6,), (8,)), Box((10,), (12,)), Box((1,), (2,))]
    assert a.grown_over(others) == Box((0,), (6,))
    assert a.grown_over(others, touching=True) == Box((0,), (8,))
    assert a.grown_over([Box((1,), (2,))]) is a
    assert Box.touching_groups([Box((3,), (3,))]) == ()
    assert Box.touching_groups([x]) == (x,)
    # (a corner is no contact: 2/4/6-connectivity, as Celerity; in 3-D an edge is none either)
    assert Box.touching_groups([x, Box((2, 2), (4, 4))]) == (x, Box((2, 2), (4, 4)))
    assert not Box((0, 0, 0), (1, 1, 1)).touches(Box((1, 1, 0), (2, 2, 1)))
    assert Box((0, 0, 0), (1, 1, 1)).touches(Box((1, 0, 0), (2, 1, 1)))
    # (bounding boxes of separate pieces that overlap are merged: allocations do not overlap)
    assert Box.touching_groups([Box((0, 0), (1, 4)), Box((3, 0), (4, 4)), Box((1, 3), (3, 4)),
                                Box((2, 1), (3, 2))]) == (Box((0, 0), (4, 4)),)


def test_empty_boxes_have_one_representation():
    empties = [Box((3,), (3,)), Box((5,), (2,)), Box((0, 0), (4, 0)), Box((-3, 7), (9, 2)),
               Box((1, 1, 1), (2, 2, 1)), Box((4, 4, 4), (0, 0, 0)), Box((0,), (4,)) & Box((4,), (8,))]
    for e in empties:
        assert e.empty and not e
        assert e.lo == (0, 0, 0) and e.hi == (0, 0, 0)
        assert e.area == 0
        assert e.min == (0,) * e.dims and e.max == (0,) * e.dims
        assert e.range == (0,) * e.dims
        assert not e.intersects(Box((-100,) * e.dims, (100,) * e.dims))
        assert Box((-100,) * e.dims, (100,) * e.dims).contains(e)
        assert repr(e) == "Box(empty)"
    for a, b in itertools.combinations(empties, 2):
        assert a == b and hash(a) == hash(b)
    assert Region(empties).corners == ()
    assert Region(empties) == Region()
    assert Region([Box((0,), (0,))]).empty
    assert Region.from_box(Box((2, 2), (2, 9))) == Region()
    assert as_region(Box((1,), (0,))).empty
    # an empty box is a neutral element
    r = Region([Box((0, 0), (4, 4))])
    assert r | Box((3, 3), (3, 3)) == r
    assert r - Box((3, 3), (1, 1)) == r
    assert (r & Box((9, 9), (2, 2))).empty
    assert r.contains(Box((7, 7), (1, 1)))
    assert Box((1, 1), (2, 2)).bounding(Box((5, 5), (5, 5))) == Box((1, 1), (2, 2))
    assert Box((5, 5), (5, 5)).bounding(Box((1, 1), (2, 2))) == Box((1, 1), (2, 2))


def test_zero_dimensional_box_is_a_single_point():
    p = Box((), ())
    assert p.dims == 0 and not p.empty and p.area == 1
    assert p.min == () and p.max == () and p.range == () and p.offset == ()
    assert p.lo == (0, 0, 0) and p.hi == (1, 1, 1)
    assert p.contains(()) and () in p
    assert p.contains(Box((), ()))
    assert p & Box((), ()) == p
    assert p.intersects(Box((), ()))
    assert p.slices == ()
    assert p.to_json() == [[], []]
    assert Box.full(()) == p
    r = Region([p, Box((), ())])
    assert len(r) == 1 and r.area == 1 and r.dims == 0
    assert r == Region.from_box(p) == p
    assert r.contains(()) and r.contains(p)
    assert (r - p).empty and (r - r).empty
    assert (r | r) == r and (r & r) == r
    assert r.bounding_box == p
    assert r.to_json() == [[[], []]]
    assert list(r) == [p]
    assert Subrange((), ()).box.empty is False


def test_box_constructor_checks():
    with pytest.raises(ValueError):
        Box((0, 0), (1,))
    with pytest.raises(ValueError):
        Box((0, 0, 0, 0), (1, 1, 1, 1))
    with pytest.raises(ValueError):
        Subrange((0, 0), (1,))
    with pytest.raises(TypeError):
        Region([(0, 1)])
    b = Box(np.array([1, 2]), np.array([3, 4]))
    assert b.lo == (1, 2, 0) and all(type(v) is int for v in b.lo + b.hi)
    assert Box.full((4, 5)) == Box((0, 0), (4, 5))
    s = Subrange((1, 2), (3, 4))
    assert s.min == (1, 2) and s.max == (4, 6) and s.dims == 2
    assert s.box == Box((1, 2), (4, 6))
    assert Subrange.from_box(s.box) == s and hash(Subrange.from_box(s.box)) == hash(s)


# =========================================================================== Region


def test_a_region_of_boxes_of_different_dimensionality_is_refused():
    """Boxes are stored padded to 3-D, so a 1-D box among 2-D ones would silently mean a
    one-wide 2-D box; empty boxes and regions carry no points and mix freely."""
    import celeritas as cl
    with pytest.raises(cl.GeometryError, match=r"share one dimensionality: Box\(\[0, 0\], \[1, 1\]\) is 2-D, "
                                               r"the boxes before it 1-D"):
        Region([Box((0,), (1,)), Box((0, 0), (1, 1))])
    with pytest.raises(cl.GeometryError, match="is 3-D, the boxes before it 2-D"):
        Region([Region([Box((0, 0), (2, 2))]), Region([Box((0, 0, 0), (1, 1, 1))])])
    r = Region([Box((0, 0), (1, 1)), Box((0,), (0,)), Region.empty_region(1), Box((2, 2), (3, 3))])
    assert r.dims == 2 and r.area == 2


def test_behaviours_item_13_region_normalization():
    # BEHAVIOURS.md 13: "Region normalization: the 2-D boxes {[0,0]-[8,2], [0,2]-[2,4],
    # [6,2]-[8,4], [0,4]-[8,6]} form the same region as {[0,0]-[2,6], [2,0]-[6,2],
    # [2,4]-[6,6], [6,0]-[8,6]}, and compare equal."
    a = Region([Box((0, 0), (8, 2)), Box((0, 2), (2, 4)), Box((6, 2), (8, 4)), Box((0, 4), (8, 6))])
    b = Region([Box((0, 0), (2, 6)), Box((2, 0), (6, 2)), Box((2, 4), (6, 6)), Box((6, 0), (8, 6))])
    assert a == b
    assert a.corners == b.corners
    assert hash(a) == hash(b)
    assert a.area == b.area == 48 - 8
    assert (a - b).empty and (b - a).empty
    assert a.bounding_box == Box((0, 0), (8, 6))
    assert not a.contains((3, 3)) and a.contains((1, 3))


@pytest.mark.parametrize("d", DIMS)
@SETTINGS
@given(data=st.data())
def test_region_construction_is_canonical(d, data):
    bs = data.draw(box_lists(d, 9))
    r = Region(bs)
    m = boxes_mask(bs, d)
    assert np.array_equal(region_mask(r, d), m)
    check_normalized(r, d, m)
    # constructing from its own boxes, or from a Region, is the identity
    assert Region(list(r)).corners == r.corners
    assert Region([r]).corners == r.corners
    assert as_region(r) is r
    assert as_region(bs) == r
    assert Region.from_corners([(b.lo, b.hi) for b in bs if not b.empty], d).corners == r.corners
    assert Region.from_corners(r.corners, d, normalized=True) == r
    assert r.to_json() == [[list(b.min), list(b.max)] for b in r]


@pytest.mark.parametrize("d", DIMS)
@SETTINGS
@given(data=st.data())
def test_equal_point_sets_give_equal_regions(d, data):
    bs = data.draw(box_lists(d, 6))
    other = data.draw(recut(bs, d))
    ra, rb = Region(bs), Region(other)
    assert np.array_equal(boxes_mask(bs, d), boxes_mask(other, d))  # the recut is valid
    assert ra == rb
    assert ra.corners == rb.corners
    assert hash(ra) == hash(rb)
    # and unequal point sets are unequal
    cs = data.draw(box_lists(d, 6))
    rc = Region(cs)
    assert (ra == rc) == np.array_equal(boxes_mask(bs, d), boxes_mask(cs, d))


@pytest.mark.parametrize("d", DIMS)
@SETTINGS
@given(data=st.data())
def test_region_set_operations_match_mask(d, data):
    a = data.draw(regions(d))
    b = data.draw(regions(d) | boxes(d))
    ma = region_mask(a, d)
    mb = region_mask(b, d) if isinstance(b, Region) else box_mask(b, d)
    for result, expected in ((a | b, ma | mb), (a & b, ma & mb), (a - b, ma & ~mb),
                             (a.union(b), ma | mb), (a.intersection(b), ma & mb),
                             (a.difference(b), ma & ~mb)):
        assert isinstance(result, Region)
        assert np.array_equal(region_mask(result, d), expected)
        check_normalized(result, d, expected)
        assert result.dims == d
    assert a.intersects(b) == bool((ma & mb).any())
    assert a.contains(b) == (not (mb & ~ma).any())
    assert (b in a) == a.contains(b)
    assert a.area == int(ma.sum())
    bb = a.bounding_box
    exp = mask_bounding(ma, d)
    assert (bb.min, bb.max) == exp if exp is not None else bb.empty
    assert bb.dims == d
    p = data.draw(points(d))
    lo = SPACE[d][0]
    assert a.contains(p) == bool(ma[tuple(v - lo for v in p)])
    assert (p in a) == a.contains(p)
    assert a.empty == (not ma.any()) and bool(a) == bool(ma.any())
    assert (a == b) == np.array_equal(ma, mb)


@pytest.mark.parametrize("d", DIMS)
@SETTINGS
@given(data=st.data())
def test_region_operator_algebra(d, data):
    a = data.draw(regions(d, 5))
    b = data.draw(regions(d, 5))
    c = data.draw(regions(d, 5))
    assert a | b == b | a and (a | b).corners == (b | a).corners
    assert a & b == b & a
    assert (a | b) | c == a | (b | c)
    assert a & (b | c) == (a & b) | (a & c)
    assert (a - b) | (a & b) == a
    assert ((a - b) & b).empty
    assert a | a == a and a & a == a and (a - a).empty
    # box operands on either side
    for box in b:
        assert box & a == a & box
        assert box | a == a | box
        assert (box - a) == Region.from_box(box) - a
    # chained differences/unions agree with one-shot set operations
    acc = Region()
    for box in c:
        acc = acc | box
    assert acc == c and acc.corners == c.corners
    rem = a
    for box in b:
        rem = rem - box
    assert rem == a - b and rem.corners == (a - b).corners


@pytest.mark.parametrize("d", DIMS)
@SETTINGS
@given(data=st.data())
def test_region_contains_and_intersects_boxes(d, data):
    r = data.draw(regions(d))
    b = data.draw(boxes(d))
    mr, mb = region_mask(r, d), box_mask(b, d)
    assert r.contains(b) == (not (mb & ~mr).any())
    assert r.intersects(b) == bool((mr & mb).any())
    assert r == Region(list(r))
    for x in r:
        assert r.contains(x)
        assert r.intersects(x) is True
    assert r.contains(r) and r.contains(Region())


@pytest.mark.parametrize("d", DIMS)
@SETTINGS
@given(data=st.data())
def test_public_fast_paths_match_mask(d, data):
    """The fast paths the generators use (bounds, single box, bounding-box tests,
    containment in a box, corners round trip) agree with the mask model."""
    r = data.draw(regions(d))
    other = data.draw(boxes(d) | regions(d, 4))
    m = region_mask(r, d)
    om = box_mask(other, d) if isinstance(other, Box) else region_mask(other, d)
    bb = mask_bounding(m, d)
    if bb is None:
        assert r.bounds == ((0, 0, 0), (0, 0, 0))
    else:
        lo, hi = r.bounds
        assert (lo[:d], hi[:d]) == bb and lo[d:] == (0,) * (3 - d) and hi[d:] == (1,) * (3 - d)
    single = r.as_box()
    assert (single is not None) == (len(r) == 1)
    if single is not None:
        assert np.array_equal(box_mask(single, d), m)
    assert Region.from_corners(r.corners, d, normalized=True) == r
    assert Region.from_corners(list(reversed(r.corners)), d) == r
    # bounds_intersect is necessary for intersecting, and exact for boxes
    if r.intersects(other):
        assert r.bounds_intersect(other)
    obb = mask_bounding(om, d)
    meet = bb is not None and obb is not None and all(
        a0 < b1 and b0 < a1 for a0, a1, b0, b1 in zip(bb[0], bb[1], obb[0], obb[1]))
    assert r.bounds_intersect(other) == meet
    # a box contains a region exactly when it holds the region's points
    box = data.draw(boxes(d))
    assert box.contains(r) == (not (m & ~box_mask(box, d)).any())
    box2 = data.draw(boxes(d))
    assert box.contains_box(box2) == box.contains(box2) == (not (box_mask(box2, d) & ~box_mask(box, d)).any())
    assert Box.from_bounds(box.lo, box.hi, d) == box if not box.empty else True


@pytest.mark.parametrize("d", DIMS)
@SETTINGS
@given(data=st.data())
def test_region_map_snapshot_restore(d, data):
    """A restored snapshot behaves exactly like the map it was taken of."""
    extent = data.draw(boxes(d, allow_empty=False))
    a = RegionMap(extent, 0)
    for _ in range(data.draw(st.integers(0, 6))):
        a.update(data.draw(boxes(d) | regions(d, 3)), data.draw(VALUES))
    snap = a.snapshot()
    assert hash(snap) == hash(a.snapshot()) and snap == a.snapshot()
    b = RegionMap(extent, 1)
    b.restore(snap)
    assert b.snapshot() == snap
    ops = [(data.draw(boxes(d) | regions(d, 3)), data.draw(VALUES)) for _ in range(data.draw(st.integers(1, 5)))]
    for where, v in ops:
        assert sorted(a.update_collect(where, v)) == sorted(b.update_collect(where, v))
    assert a.query() == b.query() and a.snapshot() == b.snapshot()
    b.restore(snap)   # back to the earlier state, whatever happened since
    assert b.snapshot() == snap
    with pytest.raises(ValueError):
        RegionMap(Box.from_bounds((0, 0, 0), (99, 1, 1), 1) if d == 1 else Box((0,) * d, (99,) * d), 0).restore(snap)


def test_region_dims_and_mixed_constructors():
    r = Region([Box((0,), (4,)), Box((2,), (8,))])
    assert r.dims == 1 and list(r) == [Box((0,), (8,))]
    assert list(r)[0].dims == 1
    assert Region([], dims=2).dims == 2
    e = Region.empty_region(3)
    assert e.dims == 3 and e.empty and not e and e.area == 0 and e.bounding_box.empty
    assert r.with_dims(1) is r
    assert Region.from_box(Box((1, 2), (3, 4))).dims == 2
    # set operations keep the dimensionality of non-empty operands
    a = Region([Box((0, 0), (4, 4))])
    assert (a - a).dims == 2 and (a & Box((9, 9), (10, 10))).dims == 2
    assert (Region() | a).dims == 2


# ======================================================================== RegionMap
VALUES = st.integers(0, 3)


def check_query(result, query_mask, model, d, extent_mask):
    """Query results: sorted, disjoint, exact cover of the query clipped to the extent,
    right values, and per value the canonical decomposition (maximally merged)."""
    keys = [(b.lo, b.hi) for b, _ in result]
    assert keys == sorted(keys)
    covered = np.zeros(_shape(d), dtype=bool)
    per_value: dict = {}
    for b, v in result:
        assert not b.empty and b.dims == d
        mb = box_mask(b, d)
        assert not (covered & mb).any(), "query boxes overlap"
        covered |= mb
        assert (model[mb] == v).all(), f"wrong value {v} in {b}"
        per_value.setdefault(v, []).append((b.lo, b.hi))
    assert np.array_equal(covered, query_mask & extent_mask)
    for v, pairs in per_value.items():
        assert tuple(pairs) == canonical_pairs(query_mask & extent_mask & (model == v), d)


@pytest.mark.parametrize("d", DIMS)
@SETTINGS
@given(data=st.data())
def test_region_map_update_query_sequences(d, data):
    extent = data.draw(boxes(d, allow_empty=False))
    default = data.draw(VALUES)
    rm = RegionMap(extent, default)
    ext_mask = box_mask(extent, d)
    model = np.full(_shape(d), -1)
    model[ext_mask] = default
    assert rm.dims == d
    steps = data.draw(st.integers(0, 8))
    for _ in range(steps):
        where = data.draw(boxes(d) | regions(d, 4))
        v = data.draw(VALUES)
        rm.update(where, v)
        wm = box_mask(where, d) if isinstance(where, Box) else region_mask(where, d)
        model[wm & ext_mask] = v
        # entries stay disjoint, inside the extent and cover it exactly
        cov = np.zeros(_shape(d), dtype=bool)
        for b, val in rm.query():
            mb = box_mask(b, d)
            assert not (cov & mb).any()
            cov |= mb
        assert np.array_equal(cov, ext_mask)
        q = data.draw(st.none() | boxes(d) | regions(d, 4))
        res = rm.query(q)
        qm = np.ones(_shape(d), dtype=bool) if q is None else (
            box_mask(q, d) if isinstance(q, Box) else region_mask(q, d))
        check_query(res, qm, model, d, ext_mask)
        # query_values: one region per distinct value, disjoint, exact
        qv = rm.query_values(q)
        seen = [v for _, v in qv]
        assert len(seen) == len(set(seen))
        total = np.zeros(_shape(d), dtype=bool)
        for reg, val in qv:
            assert isinstance(reg, Region) and not reg.empty
            mr = region_mask(reg, d)
            assert np.array_equal(mr, qm & ext_mask & (model == val))
            check_normalized(reg, d, mr)
            total |= mr
        assert np.array_equal(total, qm & ext_mask)
    assert rm.values() == set(np.unique(model[ext_mask]).tolist())
    k = data.draw(VALUES)
    rk = rm.region_of(lambda v: v == k)
    assert np.array_equal(region_mask(rk, d), ext_mask & (model == k))
    check_normalized(rk, d)
    # apply: a function of the old value, only inside `where`
    where = data.draw(boxes(d) | regions(d, 3))
    rm.apply(where, lambda v: (v * 7 + 1) % 5)
    wm = (box_mask(where, d) if isinstance(where, Box) else region_mask(where, d)) & ext_mask
    model[wm] = (model[wm] * 7 + 1) % 5
    check_query(rm.query(), np.ones(_shape(d), dtype=bool), model, d, ext_mask)


def test_region_map_basics():
    rm = RegionMap(Box((0,), (16,)), None)
    assert rm.query() == [(Box((0,), (16,)), None)]
    rm.update(Box((4,), (8,)), "a")
    rm.update(Box((8,), (12,)), "a")  # adjacent equal values merge
    assert rm.query() == [(Box((0,), (4,)), None), (Box((4,), (12,)), "a"), (Box((12,), (16,)), None)]
    assert rm.query(Box((2,), (6,))) == [(Box((2,), (4,)), None), (Box((4,), (6,)), "a")]
    rm.update(Box((-5,), (2,)), "b")  # clipped to the extent
    assert rm.query(Box((-10,), (3,))) == [(Box((0,), (2,)), "b"), (Box((2,), (3,)), None)]
    rm.update(Box((20,), (30,)), "c")  # entirely outside: no-op
    assert "c" not in rm.values()
    rm.update(Box((3,), (3,)), "d")  # empty: no-op
    assert rm.values() == {None, "a", "b"}
    assert rm.query(Box((50,), (60,))) == []
    assert rm.query(Region()) == []
    rm.update(Region([Box((0,), (16,))]), 1)
    assert rm.query() == [(Box((0,), (16,)), 1)] and len(rm) == 1
    # 2-D: two halves written with the same value are one box in a query
    m2 = RegionMap(Box((0, 0), (8, 8)), 0)
    m2.update(Box((0, 0), (4, 8)), 5)
    m2.update(Box((4, 0), (8, 8)), 5)
    assert m2.query() == [(Box((0, 0), (8, 8)), 5)]
    m2.update(Box((2, 2), (6, 6)), 1)
    assert dict((v, Region([b for b, w in m2.query() if w == v])) for v in (5, 1)) == {
        5: Region([Box((0, 0), (8, 8))]) - Box((2, 2), (6, 6)), 1: Region([Box((2, 2), (6, 6))])}
    # an empty extent holds nothing
    e = RegionMap(Box((0,), (0,)), 3)
    e.update(Box((0,), (4,)), 1)
    assert e.query() == [] and e.values() == set()


def test_region_map_does_not_fragment_unboundedly():
    # last-writer tracking: 4 chunks rewritten with shifted boundaries many times;
    # the number of stored entries stays bounded by the number of distinct runs
    rm = RegionMap(Box((0,), (4096,)), None)
    for t in range(200):
        for c in range(4):
            lo = c * 1024 + (t % 3) * 8
            rm.update(Box((lo,), (lo + 1024,)), (t, c))
    assert len(rm) <= 8
    rm2 = RegionMap(Box((0, 0), (64, 64)), 0)
    for t in range(100):
        rm2.update(Box((t % 7, t % 5), (t % 7 + 30, t % 5 + 40)), t % 3)
    assert len(rm2) <= 3 * 16


# ============================================================= regressions / corners
def test_negative_coordinates_and_touching_boxes():
    r = Region([Box((-4, -4), (0, 0)), Box((0, -4), (4, 0))])
    assert list(r) == [Box((-4, -4), (4, 0))]
    r = Region([Box((-4,), (-1,)), Box((-1,), (0,))])
    assert list(r) == [Box((-4,), (0,))]
    # a box with max == (0, 0, 0) but negative min is not empty
    b = Box((-1, -1, -1), (0, 0, 0))
    assert not b.empty and b.area == 1 and b != Box((0,), (0,))


def test_union_of_touching_slabs_merges_along_dim0():
    r = Region([Box((0, 0), (2, 4))]) | Box((2, 0), (5, 4))
    assert list(r) == [Box((0, 0), (5, 4))]
    r = Region([Box((0, 0, 0), (2, 2, 2)), Box((0, 0, 2), (2, 2, 4)), Box((0, 2, 0), (2, 4, 4)),
                Box((2, 0, 0), (4, 4, 4))])
    assert list(r) == [Box((0, 0, 0), (4, 4, 4))]


@pytest.mark.parametrize("d", [2, 3])
@settings(SETTINGS, max_examples=max(20, SETTINGS.max_examples // 4))
@given(data=st.data())
def test_larger_regions_match_mask(d, data):
    # many boxes: long sweeps, and the paths taken only for larger operands
    a = Region(data.draw(st.lists(boxes(d), min_size=10, max_size=24)))
    b = Region(data.draw(st.lists(boxes(d), min_size=10, max_size=24)))
    ma, mb = region_mask(a, d), region_mask(b, d)
    for result, expected in ((a | b, ma | mb), (a & b, ma & mb), (a - b, ma & ~mb), (b - a, mb & ~ma)):
        check_normalized(result, d, expected)
    assert a.intersects(b) == bool((ma & mb).any())
    assert a.contains(b) == (not (mb & ~ma).any())
    assert (a | b).contains(b) and (a | b).contains(a)
    box = data.draw(boxes(d))
    assert np.array_equal(region_mask(a - box, d), ma & ~box_mask(box, d))
    check_normalized(a - box, d)
    check_normalized(a & box, d)
    check_normalized(a | box, d)


@pytest.mark.parametrize("d", DIMS)
@SETTINGS
@given(data=st.data())
def test_box_operators_give_regions(d, data):
    a = data.draw(boxes(d))
    b = data.draw(boxes(d))
    r = data.draw(regions(d, 4))
    ma, mb, mr = box_mask(a, d), box_mask(b, d), region_mask(r, d)
    for result, expected in ((a | b, ma | mb), (a - b, ma & ~mb), (a | r, ma | mr), (a - r, ma & ~mr),
                             (a & r, ma & mr)):
        assert isinstance(result, Region)
        check_normalized(result, d, expected)
    assert isinstance(a & b, Box)


def test_mixed_dimensionality():
    r1 = Region([Box((0,), (4,))])
    b2 = Box((0, 0), (4, 1))
    assert r1 == b2  # the same point set: [0, 4) x [0, 1)
    u = r1 | b2
    assert u.dims == 2 and list(u)[0].dims == 2 and list(u)[0].max == (4, 1)
    assert (r1 & b2).dims == 2
    assert (r1 - Box((0, 0), (1, 1))).dims == 1
    assert Region([Box((0,), (4,))]).with_dims(2).dims == 2
    assert Region([Box((0,), (4,))]).with_dims(2) == r1
    assert repr(Region([Box((0, 0), (2, 2))])) == "Region([[0, 0], [2, 2]])"
    assert repr(Box((1,), (2,))) == "Box([1], [2])"
    assert Box((0,), (4,)).with_dims(2).dims == 2 and Box((3,), (3,)).with_dims(2).empty


def test_region_map_apply_swaps_and_merges_values():
    rm = RegionMap(Box((0,), (12,)), 1)
    rm.update(Box((4,), (8,)), 2)
    rm.apply(Box((2,), (10,)), lambda v: 3 - v)  # swap 1 <-> 2 inside [2, 10)
    assert rm.query() == [(Box((0,), (2,)), 1), (Box((2,), (4,)), 2), (Box((4,), (8,)), 1),
                          (Box((8,), (10,)), 2), (Box((10,), (12,)), 1)]
    rm.apply(rm.extent, lambda v: 0)  # everything to one value: one box
    assert rm.query() == [(Box((0,), (12,)), 0)] and len(rm) == 1
    # frozenset values, as the command graph keeps reader sets
    rd = RegionMap(Box((0, 0), (4, 4)), frozenset())
    rd.apply(Box((0, 0), (2, 4)), lambda s: s | {7})
    rd.apply(Box((0, 0), (4, 2)), lambda s: s | {8})
    assert {v for _, v in rd.query()} == {frozenset({7}), frozenset({7, 8}), frozenset({8}), frozenset()}
    assert rd.query(Box((0, 0), (2, 2))) == [(Box((0, 0), (2, 2)), frozenset({7, 8}))]
    rv = rd.query_values()
    assert [v for _, v in rv] == [frozenset({7, 8}), frozenset({7}), frozenset({8}), frozenset()]


def test_regression_empty_box_never_intersects():
    # an empty box is stored as [0, 0)^3; it used to "intersect" any 3-D box around the origin
    e = Box((1, 1, 1), (1, 1, 1))
    around = Box((-1, -1, -1), (1, 1, 1))
    assert not e.intersects(around) and not around.intersects(e)
    assert not Region([around]).intersects(e)
    assert (around & e).empty


def test_regression_box_and_region_operands():
    # box & region used to raise AttributeError ('Region' object has no attribute 'lo')
    b = Box((0, 0), (4, 4))
    r = Region([Box((2, 2), (6, 6))])
    assert b & r == Region([Box((2, 2), (4, 4))])
    assert b | r == r | b and (b | r).area == 16 + 16 - 4
    assert b - r == Region([b]) - r
    assert hash(Region([b])) == hash(b) and Region([b]) == b and b == Region([b])
    assert {Region([b]), b} == {b}


# ---- split_overlapping: concurrent readers' parts ------------------------------------------
class _r2(Region):
    """A region that also keeps its boxes as written (Celerity's, in the cases below)."""

    def __init__(self, *corners):
        super().__init__([Box(lo, hi) for lo, hi in corners])
        self.written = tuple(Box(lo, hi) for lo, hi in corners)


@pytest.mark.parametrize("given_regions,expected", [
    # the four cases of Celerity's instruction_graph_grid_tests.cc "computes concurrent splits
    # for potentially-overlapping receive- and copy regions" (its order is implementation-defined)
    ([_r2(((0, 0), (10, 10))), _r2(((10, 0), (20, 10))), _r2(((0, 10), (10, 20))), _r2(((10, 10), (20, 20)))],
     [_r2(((0, 0), (10, 10))), _r2(((10, 0), (20, 10))), _r2(((0, 10), (10, 20))), _r2(((10, 10), (20, 20)))]),
    ([_r2(((0, 0), (10, 10)))] * 3, [_r2(((0, 0), (10, 10)))]),
    ([_r2(((0, 0), (20, 20))), _r2(((0, 0), (15, 15))), _r2(((5, 5), (15, 15))), _r2(((8, 8), (12, 12)))],
     [_r2(((0, 15), (15, 20)), ((15, 0), (20, 20))),
      _r2(((0, 0), (5, 15)), ((5, 0), (15, 5))),
      _r2(((5, 5), (8, 15)), ((8, 5), (12, 8)), ((8, 12), (12, 15)), ((12, 5), (15, 15))),
      _r2(((8, 8), (12, 12)))]),
    ([_r2(((0, 8), (10, 18)), ((8, 0), (18, 10))), _r2(((5, 13), (15, 23)), ((13, 5), (23, 15)))],
     [_r2(((0, 8), (5, 18)), ((5, 8), (8, 13)), ((8, 0), (10, 13)), ((10, 0), (13, 10)), ((13, 0), (18, 5))),
      _r2(((5, 18), (10, 23)), ((10, 13), (13, 23)), ((13, 10), (15, 23)), ((15, 10), (18, 15)), ((18, 5), (23, 15))),
      _r2(((5, 13), (10, 18)), ((13, 5), (18, 10)))]),
], ids=["disjoint", "duplicate", "nested", "partially overlapping"])
def test_split_overlapping_gives_celeritys_concurrent_parts(given_regions, expected):
    got = split_overlapping(given_regions)
    assert len(got) == len(expected)
    assert set(got) == set(expected)
    # in the same boxes, in the same order, as Celerity's expected regions list them
    assert {r.boxes for r in got} == {r.written for r in expected}


def test_split_overlapping_keeps_the_inputs_order_and_skips_empty_ones():
    a, b = _r2(((0, 0), (4, 4))), _r2(((2, 0), (6, 4)))
    assert split_overlapping([]) == []
    assert split_overlapping([Region.empty_region(2), a]) == [a]
    assert split_overlapping([a, Region.empty_region(2), b]) == [_r2(((0, 0), (2, 4))), _r2(((2, 0), (4, 4))),
                                                                 _r2(((4, 0), (6, 4)))]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3).flatmap(lambda d: st.lists(regions(d, max_size=4), max_size=5)))
def test_split_overlapping_parts_are_disjoint_and_make_up_every_input(inputs):
    parts = split_overlapping(inputs)
    for p, q in itertools.combinations(parts, 2):
        assert not p.intersects(q)
    assert all(parts)
    for r in inputs:
        inside = [p for p in parts if p.intersects(r)]
        assert all(r.contains(p) for p in inside)        # no part reaches outside an input it meets
        union = Region.empty_region(r.dims) if r.dims else r
        for p in inside:
            union = union | p
        assert union == r
    everything = [p for r in inputs for p in r.boxes]
    assert sum(p.area for p in parts) == (Region(everything).area if everything else 0)
