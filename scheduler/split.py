"""Splitting a task's iteration box into chunks (one per rank, then per device).

Celerity semantics:

* ``split_1d`` cuts along dim 0 into at most ``num_chunks`` chunks.  Chunk boundaries
  lie on multiples of ``granularity[0]`` counted from the box's min.  The box holds
  ``full = range // granularity`` whole granules; they are dealt out as evenly as
  possible, the larger chunks first (range 255 on 4 chunks: 64, 64, 64, 63), and the
  last chunk also takes the ``range % granularity`` elements left over.  So chunk
  sizes differ by at most one granule.  When there is not enough work (fewer granules
  than chunks) fewer chunks come back (range 2 on 3 chunks: two chunks). No chunk is
  ever empty.
* ``split_2d`` lays a grid of at most ``num_chunks`` chunks over dims 0 and 1 (dim 2
  is never cut) and returns the chunks in row-major order (dim 0 outer).  The grid is
  a factorization ``rows * cols = num_chunks``, each factor capped at the number of
  whole granules in its dimension.  Preference order: most chunks; then Celerity's
  near-square factorization (the divisor closest to sqrt(num_chunks), the larger
  factor on dim 0 when the box is square-ish, else the one with shorter chunk edges);
  then shorter chunk edges; then more rows.  128x128 on 4 chunks gives four 64x64
  chunks.  1-D boxes fall back to ``split_1d``.

Both are deterministic (every rank computes the same split) and return chunks that
are disjoint and cover the box exactly.  An empty box gives no chunks; a 0-D box (a
single point) gives itself.
"""
from __future__ import annotations

import math
from typing import Sequence

from .geometry import Box

__all__ = ["split_1d", "split_2d", "split_sizes"]


def split_sizes(extent: int, granularity: int, num_chunks: int) -> list[int]:
    """Sizes of the chunks that cut ``extent`` elements along one dimension."""
    if extent <= 0:
        return []
    full = extent // granularity
    if full <= 1 or num_chunks == 1:
        return [extent]
    k = num_chunks if num_chunks < full else full
    small, num_large = divmod(full, k)
    sizes = [(small + 1) * granularity] * num_large + [small * granularity] * (k - num_large)
    sizes[-1] += extent - full * granularity
    return sizes


def _check(box: Box, granularity: Sequence[int] | None, num_chunks: int) -> tuple[int, int, int]:
    if not isinstance(box, Box):
        raise TypeError(f"expected a Box, got {type(box).__name__}")
    if int(num_chunks) != num_chunks or num_chunks < 1:
        raise ValueError(f"num_chunks must be a positive integer, got {num_chunks!r}")
    g = [1, 1, 1]
    if granularity is not None:
        gs = tuple(granularity)
        for i, v in enumerate(gs):
            if int(v) != v or v < 1:
                raise ValueError(f"split granularity must be positive integers, got {gs}")
            if i < 3:
                g[i] = int(v)
    return g[0], g[1], g[2]


def _boxes_along(lo0: int, sizes: list[int]) -> list[tuple[int, int]]:
    out = []
    a = lo0
    for s in sizes:
        out.append((a, a + s))
        a += s
    return out


def split_1d(box: Box, granularity: Sequence[int] | None, num_chunks: int) -> list[Box]:
    """At most ``num_chunks`` chunks of ``box`` along dim 0 (see the module docstring)."""
    g0, _, _ = _check(box, granularity, num_chunks)
    if box.empty:
        return []
    if box.dims == 0:
        return [box]
    lo, hi, d = box.lo, box.hi, box.dims
    sizes = split_sizes(hi[0] - lo[0], g0, int(num_chunks))
    if len(sizes) == 1:
        return [box]
    return [Box.from_bounds((a, lo[1], lo[2]), (b, hi[1], hi[2]), d) for a, b in _boxes_along(lo[0], sizes)]


def _grid(r0: int, r1: int, g0: int, g1: int, n: int) -> tuple[int, int]:
    """(rows, cols) of the chunk grid for an r0 x r1 box."""
    max0 = max(1, r0 // g0)
    max1 = max(1, r1 // g1)

    def clamp(a: int, b: int) -> tuple[int, int]:
        return (a if a < max0 else max0, b if b < max1 else max1)

    # Celerity's choice: the divisor f <= sqrt(n) closest to sqrt(n) and its cofactor,
    # oriented to give more chunks, else (square-ish box) more rows, else shorter edges
    f = math.isqrt(n)
    while f > 1 and n % f:
        f -= 1
    a01, a10 = clamp(f, n // f), clamp(n // f, f)
    c01, c10 = a01[0] * a01[1], a10[0] * a10[1]
    if c01 != c10:
        celerity = a01 if c01 > c10 else a10
    else:
        squareish = math.sqrt(r0 * r1) / r0
        if 0.95 < squareish < 1.05:
            celerity = a01 if f >= n // f else a10
        else:
            celerity = a01 if _edges(r0, r1, a01) < _edges(r0, r1, a10) else a10

    best = celerity
    best_key = (-(best[0] * best[1]), 0, _edges(r0, r1, best), -best[0])
    for a in range(1, math.isqrt(n) + 1):
        if n % a:
            continue
        for cand in (clamp(a, n // a), clamp(n // a, a)):
            key = (-(cand[0] * cand[1]), 1, _edges(r0, r1, cand), -cand[0])
            if key < best_key:
                best, best_key = cand, key
    return best


def _edges(r0: int, r1: int, grid: tuple[int, int]) -> int:
    # the half-perimeter of a chunk (Celerity compares integer quotients)
    return r0 // grid[0] + r1 // grid[1]


def split_2d(box: Box, granularity: Sequence[int] | None, num_chunks: int) -> list[Box]:
    """At most ``num_chunks`` chunks of ``box`` on a grid over dims 0 and 1, row-major."""
    g0, g1, _ = _check(box, granularity, num_chunks)
    if box.empty:
        return []
    if box.dims < 2:
        return split_1d(box, granularity, num_chunks)
    lo, hi, d = box.lo, box.hi, box.dims
    r0, r1 = hi[0] - lo[0], hi[1] - lo[1]
    rows, cols = _grid(r0, r1, g0, g1, int(num_chunks))
    xs = _boxes_along(lo[0], split_sizes(r0, g0, rows))
    ys = _boxes_along(lo[1], split_sizes(r1, g1, cols))
    if len(xs) == 1 and len(ys) == 1:
        return [box]
    return [Box.from_bounds((x0, y0, lo[2]), (x1, y1, hi[2]), d) for x0, x1 in xs for y0, y1 in ys]
