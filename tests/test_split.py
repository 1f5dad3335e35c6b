"""Tests for scheduler/split.py: BEHAVIOURS.md item 6 and split properties in 1/2/3-D."""
from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from scheduler.geometry import Box, Region
from scheduler.split import split_1d, split_2d, split_sizes

SETTINGS = settings(max_examples=int(os.environ.get("GEOMETRY_EXAMPLES", 200)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------- BEHAVIOURS.md item 6
def test_behaviours_item_6_split_sizes():
    # "Split sizes on 4 ranks: range 255 -> chunks 64, 64, 64, 63; split_2d on 128x128 ->
    # four 64x64 chunks; 3 ranks and range 2 -> only ranks 0 and 1 get an execution command."
    chunks = split_1d(Box((0,), (255,)), (1,), 4)
    assert [c.range[0] for c in chunks] == [64, 64, 64, 63]
    assert chunks == [Box((0,), (64,)), Box((64,), (128,)), Box((128,), (192,)), Box((192,), (255,))]
    grid = split_2d(Box((0, 0), (128, 128)), (1, 1), 4)
    assert grid == [Box((0, 0), (64, 64)), Box((0, 64), (64, 128)),
                    Box((64, 0), (128, 64)), Box((64, 64), (128, 128))]  # row-major
    assert all(c.range == (64, 64) for c in grid)
    two = split_1d(Box((0,), (2,)), (1,), 3)
    assert two == [Box((0,), (1,)), Box((1,), (2,))]  # chunks for ranks 0 and 1 only


# ------------------------------------------------------------------- concrete cases
def test_split_1d_examples():
    assert split_1d(Box((0,), (8,)), (1,), 1) == [Box((0,), (8,))]
    assert split_1d(Box((0,), (8,)), (1,), 8) == [Box((i,), (i + 1,)) for i in range(8)]
    assert split_1d(Box((0,), (8,)), (1,), 100) == [Box((i,), (i + 1,)) for i in range(8)]
    # boundaries on multiples of the granularity, counted from the box's min
    assert split_1d(Box((3,), (19,)), (4,), 2) == [Box((3,), (11,)), Box((11,), (19,))]
    assert split_1d(Box((0,), (10,)), (4,), 2) == [Box((0,), (4,)), Box((4,), (10,))]  # remainder last
    assert split_1d(Box((0,), (3,)), (4,), 2) == [Box((0,), (3,))]  # less than one granule
    # a granularity that leaves chunks idle
    assert split_1d(Box((0,), (128,)), (64,), 4) == [Box((0,), (64,)), Box((64,), (128,))]
    # multi-dimensional boxes are cut along dim 0 only
    assert split_1d(Box((0, 5), (10, 9)), (1, 1), 2) == [Box((0, 5), (5, 9)), Box((5, 5), (10, 9))]
    assert split_1d(Box((0, 0, 0), (3, 4, 5)), (1, 1, 1), 3) == [
        Box((i, 0, 0), (i + 1, 4, 5)) for i in range(3)]
    # 0-D boxes, empty boxes
    assert split_1d(Box((), ()), (1,), 4) == [Box((), ())]
    assert split_1d(Box((4,), (4,)), (1,), 4) == []
    assert split_2d(Box((0, 0), (0, 5)), (1, 1), 4) == []
    # chunks keep the box's dimensionality
    assert all(c.dims == 2 for c in split_1d(Box((0, 0), (10, 9)), (1, 1), 3))


def test_split_2d_examples():
    # 2 chunks on a square box: along the slower dimension (dim 0)
    assert split_2d(Box((0, 0), (128, 128)), (1, 1), 2) == [Box((0, 0), (64, 128)), Box((64, 0), (128, 128))]
    # 6 on a wide box: 3 rows x 2 columns (Celerity's near-square factorization)
    six = split_2d(Box((0, 0), (300, 100)), (1, 1), 6)
    assert [c.range for c in six] == [(100, 50)] * 6
    # and on a tall box: 2 rows x 3 columns
    assert {c.range for c in split_2d(Box((0, 0), (100, 300)), (1, 1), 6)} == {(50, 100)}
    # prime counts: a 1 x n or n x 1 grid
    assert len(split_2d(Box((0, 0), (64, 64)), (1, 1), 7)) == 7
    # a thin box: all chunks along the dimension that has room (not just the sqrt factor)
    assert split_2d(Box((0, 0), (1, 1024)), (1, 1), 4) == [Box((0, 256 * i), (1, 256 * (i + 1))) for i in range(4)]
    # granularity caps the grid
    g = split_2d(Box((0, 0), (128, 128)), (64, 128), 4)
    assert g == [Box((0, 0), (64, 128)), Box((64, 0), (128, 128))]
    g = split_2d(Box((0, 0), (128, 128)), (32, 32), 16)
    assert len(g) == 16 and all(c.range == (32, 32) for c in g)
    # 1-D boxes fall back to split_1d, 3-D boxes are never cut along dim 2
    assert split_2d(Box((0,), (255,)), (1,), 4) == split_1d(Box((0,), (255,)), (1,), 4)
    assert all(c.min[2] == 0 and c.max[2] == 7 for c in split_2d(Box((0, 0, 0), (8, 8, 7)), (1, 1, 1), 4))
    # offsets
    assert split_2d(Box((10, 20), (14, 24)), (1, 1), 4) == [
        Box((10, 20), (12, 22)), Box((10, 22), (12, 24)), Box((12, 20), (14, 22)), Box((12, 22), (14, 24))]


def test_split_argument_checks():
    with pytest.raises(ValueError):
        split_1d(Box((0,), (8,)), (1,), 0)
    with pytest.raises(ValueError):
        split_1d(Box((0,), (8,)), (0,), 2)
    with pytest.raises(ValueError):
        split_2d(Box((0, 0), (8, 8)), (1, -1), 2)
    with pytest.raises(TypeError):
        split_1d(Region([Box((0,), (8,))]), (1,), 2)
    # granularity shorter or longer than the box's dimensionality
    assert split_1d(Box((0, 0), (8, 8)), (2,), 2) == split_1d(Box((0, 0), (8, 8)), (2, 1), 2)
    assert split_1d(Box((), ()), (1,), 3) == [Box((), ())]
    assert split_1d(Box((0,), (8,)), None, 2) == [Box((0,), (4,)), Box((4,), (8,))]


def test_split_sizes():
    assert split_sizes(255, 1, 4) == [64, 64, 64, 63]
    assert split_sizes(2, 1, 3) == [1, 1]
    assert split_sizes(0, 1, 3) == []
    assert split_sizes(10, 4, 3) == [4, 6]
    assert split_sizes(7, 8, 3) == [7]


# ------------------------------------------------------------------------ properties
@st.composite
def split_cases(draw, d):
    lo = tuple(draw(st.integers(-50, 50)) for _ in range(d))
    rng = tuple(draw(st.integers(0, 40)) for _ in range(d))
    gran = tuple(draw(st.sampled_from([1, 1, 1, 2, 3, 4, 8, 16])) for _ in range(d))
    n = draw(st.integers(1, 24))
    return Box(lo, tuple(a + r for a, r in zip(lo, rng))), gran, n


def check_chunks(box, chunks, n):
    assert len(chunks) <= n
    if box.empty:
        assert chunks == []
        return
    assert len(chunks) >= 1
    for c in chunks:
        assert not c.empty and c.dims == box.dims
        assert box.contains(c)
    for a, b in itertools.combinations(chunks, 2):
        assert not a.intersects(b), f"{a} and {b} overlap"
    assert sum(c.area for c in chunks) == box.area
    assert Region(chunks) == Region.from_box(box)


def check_axis(box, chunks, axis, g):
    """Cuts along ``axis`` lie on multiples of g from the box's min; sizes differ by <= g."""
    lo, hi = box.min[axis], box.max[axis]
    sizes = {}
    for c in chunks:
        a, b = c.min[axis], c.max[axis]
        assert (a - lo) % g == 0
        assert b == hi or (b - lo) % g == 0
        sizes[a] = b - a
    vals = list(sizes.values())
    assert max(vals) - min(vals) <= g
    # whole granules are dealt out large-first; only the last may carry a remainder
    starts = sorted(sizes)
    full = [sizes[s] for s in starts[:-1]]
    assert full == sorted(full, reverse=True)
    return len(sizes)


@pytest.mark.parametrize("d", [1, 2, 3])
@SETTINGS
@given(data=st.data())
def test_split_1d_properties(d, data):
    box, gran, n = data.draw(split_cases(d))
    chunks = split_1d(box, gran, n)
    check_chunks(box, chunks, n)
    assert chunks == split_1d(box, gran, n)  # deterministic
    if box.empty or d == 0:
        return
    assert check_axis(box, chunks, 0, gran[0]) == len(chunks)
    for c in chunks:  # only dim 0 is cut
        assert c.min[1:] == box.min[1:] and c.max[1:] == box.max[1:]
    assert [c.min[0] for c in chunks] == sorted(c.min[0] for c in chunks)
    # as many chunks as requested, unless there are fewer whole granules
    assert len(chunks) == min(n, max(1, box.range[0] // gran[0]))


@pytest.mark.parametrize("d", [1, 2, 3])
@SETTINGS
@given(data=st.data())
def test_split_2d_properties(d, data):
    box, gran, n = data.draw(split_cases(d))
    chunks = split_2d(box, gran, n)
    check_chunks(box, chunks, n)
    assert chunks == split_2d(box, gran, n)
    if box.empty:
        return
    if d == 1:
        assert chunks == split_1d(box, gran, n)
        return
    rows = check_axis(box, chunks, 0, gran[0])
    cols = check_axis(box, chunks, 1, gran[1])
    assert rows * cols == len(chunks)  # a grid
    assert rows <= max(1, box.range[0] // gran[0]) and cols <= max(1, box.range[1] // gran[1])
    # row-major order
    keys = [(c.min[0], c.min[1]) for c in chunks]
    assert keys == sorted(keys)
    for c in chunks:
        assert c.min[2:] == box.min[2:] and c.max[2:] == box.max[2:]
    # the grid is a factorization of n when there is room for it in both dimensions
    if box.range[0] // gran[0] >= n and box.range[1] // gran[1] >= n:
        assert len(chunks) == n
    # never fewer chunks than the best 1-D split along either dimension
    assert len(chunks) >= min(n, max(1, box.range[0] // gran[0]))
    assert len(chunks) >= min(n, max(1, box.range[1] // gran[1]))
