"""Splitting a task's range into chunks (temporary; replaced by the split helper's version)."""
from __future__ import annotations

from .geometry import Box


def _split_dim(lo: int, hi: int, gran: int, n: int) -> list[tuple[int, int]]:
    total = hi - lo
    units = -(-total // gran)
    n = max(1, min(n, units))
    out = []
    base, rem = divmod(units, n)
    pos = 0
    for i in range(n):
        cnt = base + (1 if i < rem else 0)
        a = lo + pos * gran
        pos += cnt
        b = min(hi, lo + pos * gran)
        if b > a:
            out.append((a, b))
    return out


def split_1d(box: Box, granularity, num_chunks: int) -> list[Box]:
    if box.empty:
        return []
    g = granularity[0] if granularity else 1
    out = []
    for a, b in _split_dim(box.lo[0], box.hi[0], g, num_chunks):
        out.append(Box._make((a,) + box.lo[1:], (b,) + box.hi[1:], box.dims))
    return out


def split_2d(box: Box, granularity, num_chunks: int) -> list[Box]:
    if box.dims < 2:
        return split_1d(box, granularity, num_chunks)
    best = (1, num_chunks)
    for f in range(1, int(num_chunks ** 0.5) + 1):
        if num_chunks % f == 0:
            best = (f, num_chunks // f)
    ny, nx = best
    gy = granularity[0] if granularity else 1
    gx = granularity[1] if len(granularity) > 1 else 1
    out = []
    for a0, b0 in _split_dim(box.lo[0], box.hi[0], gy, ny):
        for a1, b1 in _split_dim(box.lo[1], box.hi[1], gx, nx):
            out.append(Box._make((a0, a1, box.lo[2]), (b0, b1, box.hi[2]), box.dims))
    return out
