"""Micro-benchmarks for the scheduler's geometry package: microseconds per operation.

Run: python benchmarks/bench_geometry.py [--quick] [--compare OTHER_GEOMETRY]

``--compare`` times another version of the geometry code (a copy of an older
``scheduler/geometry/`` package directory, or of the single-file ``geometry.py`` it
replaced) on the same cases in the same process and prints both columns, so that
before/after numbers are not skewed by machine load between runs.

Cases mirror what the scheduler does per task: unions and differences of a few
(2-16) boxes in 1-D and 2-D, region construction from overlapping boxes,
intersections with a chunk box, and RegionMap update + query with ~8 entries.
"""
from __future__ import annotations

import importlib.util
import os
import random
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import scheduler.geometry as _geometry  # noqa: E402


def _boxes_1d(Box, rng: random.Random, n: int, extent: int = 1024) -> list:
    out = []
    for _ in range(n):
        a = rng.randrange(0, extent - 1)
        b = rng.randrange(a + 1, min(extent, a + extent // 4) + 1)
        out.append(Box((a,), (b,)))
    return out


def _boxes_2d(Box, rng: random.Random, n: int, extent: int = 256) -> list:
    out = []
    for _ in range(n):
        a0 = rng.randrange(0, extent - 1)
        a1 = rng.randrange(0, extent - 1)
        out.append(Box((a0, a1), (rng.randrange(a0 + 1, min(extent, a0 + extent // 3) + 1),
                                  rng.randrange(a1 + 1, min(extent, a1 + extent // 3) + 1))))
    return out


def _chunks_1d(Box, n: int, extent: int = 1024) -> list:
    step = extent // n
    return [Box((i * step,), ((i + 1) * step,)) for i in range(n)]


def _chunks_2d(Box, n: int, extent: int = 256) -> list:
    # row stripes with ghost-zone-like overlap: what stencil reads look like
    step = extent // n
    return [Box((max(0, i * step - 1), 0), (min(extent, (i + 1) * step + 1), extent)) for i in range(n)]


def bench(fn, number: int) -> float:
    fn()  # warm-up (and catches errors before timing)
    best = min(timeit.repeat(fn, number=number, repeat=5))
    return best / number * 1e6


def _snapshot(m):
    # a RegionMap's state: its containers (entries are immutable) and plain attributes
    return {s: getattr(m, s) for s in type(m).__slots__}


def _restore(m, snap):
    for s, v in snap.items():
        setattr(m, s, v.copy() if isinstance(v, (list, dict)) else v)


def cases(G):
    """Yield (name, fn, number) for the geometry module G."""
    Box = G.Box
    Region, RegionMap = G.Region, G.RegionMap
    rng = random.Random(42)
    out = []

    def run(name, fn, number):
        out.append((name, fn, number))
    # --- single boxes ---------------------------------------------------------
    a2, b2 = Box((0, 0), (64, 64)), Box((32, 32), (96, 96))
    ra2, rb2 = Region([a2]), Region([b2])
    run("box & box (2-D)", lambda: a2 & b2, 200000)
    run("Region([box]) (2-D)", lambda: Region([a2]), 200000)
    run("region | region, 1 box each (2-D, overlapping)", lambda: ra2 | rb2, 50000)
    run("region - region, 1 box each (2-D, overlapping)", lambda: ra2 - rb2, 50000)
    run("region & region, 1 box each (2-D)", lambda: ra2 & rb2, 50000)
    a1, b1 = Region([Box((0,), (128,))]), Region([Box((128,), (256,))])
    run("region | region, adjacent 1-D boxes", lambda: a1 | b1, 50000)
    run("region.contains(box) (2-D)", lambda: ra2.contains(Box((1, 1), (5, 5))), 100000)

    # --- construction from overlapping boxes -----------------------------------
    for n in (2, 4, 8, 16):
        bs1 = _boxes_1d(Box, rng, n)
        bs2 = _boxes_2d(Box, rng, n)
        run(f"Region(boxes) 1-D, {n} overlapping boxes", lambda bs=bs1: Region(bs), 20000)
        run(f"Region(boxes) 2-D, {n} overlapping boxes", lambda bs=bs2: Region(bs), 5000 if n > 4 else 20000)

    # --- unions / differences of normalized regions ----------------------------
    for n in (2, 4, 8, 16):
        c1 = [Region([b]) for b in _chunks_1d(Box, n)]
        c2 = [Region([b]) for b in _chunks_2d(Box, n)]

        def fold_union(rs):
            acc = rs[0]
            for r in rs[1:]:
                acc = acc | r
            return acc

        run(f"fold union of {n} chunk regions 1-D", lambda rs=c1: fold_union(rs), 5000)
        run(f"fold union of {n} ghost-zone stripes 2-D", lambda rs=c2: fold_union(rs), 2000)
        r1 = Region(_boxes_1d(Box, rng, n))
        s1 = Region(_boxes_1d(Box, rng, n))
        r2 = Region(_boxes_2d(Box, rng, n))
        s2 = Region(_boxes_2d(Box, rng, n))
        # operands are fresh Region objects each time (no cached internal state):
        # the scheduler mostly combines regions it has just built
        # (an older geometry under --compare may predate the public names)
        F = getattr(Region, "from_corners", None) or Region._from_pairs
        p1, q1, p2, q2 = (getattr(r, "corners", None) or r._pairs for r in (r1, s1, r2, s2))
        run(f"random region | region 1-D ({len(r1)}+{len(s1)} boxes)", lambda p1=p1, q1=q1: F(p1, 1, True) | F(q1, 1, True), 10000)
        run(f"random region - region 1-D ({len(r1)}-{len(s1)} boxes)", lambda p1=p1, q1=q1: F(p1, 1, True) - F(q1, 1, True), 10000)
        run(f"random region | region 2-D ({len(r2)}+{len(s2)} boxes)", lambda p2=p2, q2=q2: F(p2, 2, True) | F(q2, 2, True), 2000)
        run(f"random region - region 2-D ({len(r2)}-{len(s2)} boxes)", lambda p2=p2, q2=q2: F(p2, 2, True) - F(q2, 2, True), 2000)
        run(f"random region & region 2-D ({len(r2)}&{len(s2)} boxes)", lambda p2=p2, q2=q2: F(p2, 2, True) & F(q2, 2, True), 2000)
        chunk = Box((64, 64), (192, 192))
        run(f"random region & chunk box 2-D ({len(r2)} boxes)", lambda p2=p2, chunk=chunk: F(p2, 2, True) & chunk, 10000)

    # --- region maps -----------------------------------------------------------
    def regionmap_case(dims: int):
        # ~8 entries: 8 chunks (1-D) or a 4x2 grid (2-D) of distinct last writers,
        # then a write straddling chunk borders and a read of a ghost-zone-like box
        if dims == 1:
            m = RegionMap(Box((0,), (1024,)), 0)
            for i in range(8):
                m.update(Box((i * 128,), ((i + 1) * 128,)), i + 1)
            u = Box((200,), (600,))
            q = Box((100,), (700,))
        else:
            m = RegionMap(Box((0, 0), (256, 256)), 0)
            for i in range(4):
                for j in range(2):
                    m.update(Box((i * 64, j * 128), ((i + 1) * 64, (j + 1) * 128)), 2 * i + j + 1)
            u = Box((40, 100), (150, 200))
            q = Box((20, 20), (180, 240))
        state = _snapshot(m)

        def step():
            _restore(m, state)
            m.update(u, 9)
            return m.query(q)

        return m, step, q

    for dims in (1, 2):
        m, step, q = regionmap_case(dims)
        n = len(m)
        run(f"RegionMap {dims}-D ({n} entries): update + query", step, 5000)
        m, step, q = regionmap_case(dims)
        run(f"RegionMap {dims}-D ({n} entries): query only", lambda m=m, q=q: m.query(q), 10000)
        run(f"RegionMap {dims}-D ({n} entries): query whole", lambda m=m: m.query(), 10000)

    # --- a scheduler-like loop: last-writer tracking on a 1-D buffer -------------
    def writer_loop():
        m = RegionMap(Box((0,), (4096,)), None)
        for t in range(32):
            for c in range(4):
                lo = c * 1024 + (t % 3) * 8
                m.update(Box((lo,), (lo + 1024,)), (t, c))
            m.query(Box((1000,), (3100,)))
        return m

    run("RegionMap 1-D: 32 tasks x 4 chunk updates + 1 query", writer_loop, 100)
    return out


def _load(path: str):
    if os.path.isdir(path):   # a package: import it under a name of its own
        spec = importlib.util.spec_from_file_location("geometry_compare", os.path.join(path, "__init__.py"),
                                                      submodule_search_locations=[path])
    else:
        spec = importlib.util.spec_from_file_location("geometry_compare", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    argv = sys.argv[1:]
    scale = 0.1 if "--quick" in argv else 1.0
    mods = [("scheduler.geometry", _geometry)]
    if "--compare" in argv:
        path = argv[argv.index("--compare") + 1]
        mods.insert(0, (os.path.basename(path), _load(path)))
    per_mod = [cases(m) for _, m in mods]
    header = f"{'case':<58s}" + "".join(f" {name[:16]:>16s}" for name, _ in mods)
    if len(mods) == 2:
        header += f" {'speedup':>8s}"
    print(header + "   (us per operation)")
    for k in range(len(per_mod[0])):
        name = per_mod[-1][k][0]
        times = [bench(pm[k][1], max(1, int(pm[k][2] * scale))) for pm in per_mod]
        line = f"{name:<58s}" + "".join(f" {t:16.2f}" for t in times)
        if len(times) == 2:
            line += f" {times[0] / times[1]:7.1f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
