"""Random celeritas programs and their sequential numpy interpretation.

A program is data (``Program``); ``run_celeritas`` submits it through the public
API, ``run_model`` interprets the same kernels over whole buffers with numpy.
Kernels compute integers per element from what their range mappers grant, so
any split across ranks, devices and oversubscription must give identical
buffers, fence results, host-task observations and reductions.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import celeritas as cl
from scheduler.geometry import Box

MOD = 997


@dataclass
class Read:
    buffer: int
    mapper: str                 # one_to_one | all | fixed | slice | neighborhood | transposed
    fixed_box: tuple = ()       # (min, max) for fixed
    dim: int = 0                # for slice


@dataclass
class Task:
    kind: str                   # "kernel" | "host_sum" | "reduce" | "fence"
    write: int | None = None
    mode: str = "discard_write"
    reads: list[Read] = field(default_factory=list)
    c0: int = 1
    target: int | None = None   # reduction buffer index / fenced buffer


@dataclass
class Program:
    shapes: list[tuple[int, ...]]
    init: list[np.ndarray]
    tasks: list[Task]
    num_reductions: int = 0


def generate(rng: random.Random) -> Program:
    nb = rng.randint(2, 4)
    shapes = []
    for _ in range(nb):
        d = rng.randint(1, 3)
        shapes.append(tuple(rng.randint(1, 9 if d < 3 else 5) for _ in range(d)))
    init = [np.array(np.random.default_rng(rng.randrange(1 << 30)).integers(0, 50, size=s), dtype=np.int64)
            for s in shapes]
    tasks: list[Task] = []
    nred = 0
    for _ in range(rng.randint(3, 12)):
        r = rng.random()
        if r < 0.12:
            tasks.append(Task("fence", target=rng.randrange(nb)))
            continue
        if r < 0.22:
            tasks.append(Task("host_sum", reads=[Read(rng.randrange(nb), "all")]))
            continue
        w = rng.randrange(nb)
        dims = len(shapes[w])
        reads = []
        for _ in range(rng.randint(0, 3)):
            b = rng.randrange(nb)
            same = len(shapes[b]) == dims
            options = ["all", "fixed"] + (["one_to_one", "slice", "neighborhood", "transposed"] if same else [])
            if b == w and r >= 0.32:
                # chunks of one kernel may read what they write only element-wise (anything else races)
                options = ["one_to_one"]
            m = rng.choice(options)
            rd = Read(b, m)
            if m == "fixed":
                lo = tuple(rng.randrange(s) for s in shapes[b])
                hi = tuple(rng.randint(l + 1, s) for l, s in zip(lo, shapes[b]))
                rd.fixed_box = (lo, hi)
            if m == "slice":
                rd.dim = rng.randrange(dims)
            reads.append(rd)
        if r < 0.32:
            tasks.append(Task("reduce", reads=reads, c0=rng.randint(0, 5), target=nred, write=w))
            nred += 1
            continue
        mode = rng.choice(["discard_write", "write", "read_write", "discard_read_write"])
        tasks.append(Task("kernel", write=w, mode=mode, reads=reads, c0=rng.randint(0, 9)))
    return Program(shapes, init, tasks, nred)


# ---- the per-element semantics, shared by the kernels and the model -------------------
def mapper_of(rd: Read):
    if rd.mapper == "fixed":
        lo, hi = rd.fixed_box
        return cl.fixed(cl.Subrange(lo, tuple(h - l for l, h in zip(lo, hi))))
    if rd.mapper == "slice":
        return cl.slice(rd.dim)
    if rd.mapper == "neighborhood":
        return None  # built per kernel dims
    return {"one_to_one": cl.one_to_one, "all": cl.all, "transposed": cl.transposed}[rd.mapper]()


def _clip(box: Box, shape) -> Box:
    return box & Box.full(shape)


def _place(out: np.ndarray, chunk: Box, part: Box, values: np.ndarray) -> None:
    if part.empty:
        return
    out[part.slices_in(chunk)] += values


def contribution(rd: Read, chunk: Box, shape, get: Callable[[Box], np.ndarray]) -> np.ndarray | int:
    """What ``rd`` adds to every element of ``chunk``; ``get(box)`` reads the buffer in global coordinates."""
    cs = chunk.range
    if rd.mapper == "all":
        return int(get(Box.full(shape)).sum()) % MOD
    if rd.mapper == "fixed":
        lo, hi = rd.fixed_box
        return int(get(Box(lo, hi)).sum()) % MOD
    out = np.zeros(cs, dtype=np.int64)
    if rd.mapper == "one_to_one":
        part = _clip(chunk, shape)
        if not part.empty:
            _place(out, chunk, part, get(part))
        return out
    if rd.mapper == "transposed":
        rev = Box(tuple(reversed(chunk.min)), tuple(reversed(chunk.max)))
        part = _clip(rev, shape)
        if not part.empty:
            vals = get(part).transpose(tuple(reversed(range(len(cs)))))
            back = Box(tuple(reversed(part.min)), tuple(reversed(part.max)))
            _place(out, chunk, back, vals)
        return out
    if rd.mapper == "slice":
        d = rd.dim
        lo = list(chunk.min)
        hi = list(chunk.max)
        lo[d], hi[d] = 0, shape[d]
        part = _clip(Box(tuple(lo), tuple(hi)), shape)
        if part.empty:
            return out
        sums = get(part).sum(axis=d, keepdims=True)
        lo2 = list(part.min)
        hi2 = list(part.max)
        lo2[d], hi2[d] = chunk.min[d], chunk.max[d]
        target = Box(tuple(lo2), tuple(hi2))
        _place(out, chunk, target, np.broadcast_to(sums, target.range))
        return out
    if rd.mapper == "neighborhood":
        n = len(cs)
        shifts = [(0,) * n] + [tuple((s if i == k else 0) for i in range(n)) for k in range(n) for s in (-1, 1)]
        for sh in shifts:
            src = Box(tuple(a + s for a, s in zip(chunk.min, sh)), tuple(a + s for a, s in zip(chunk.max, sh)))
            part = _clip(src, shape)
            if part.empty:
                continue
            dst = Box(tuple(a - s for a, s in zip(part.min, sh)), tuple(a - s for a, s in zip(part.max, sh)))
            _place(out, chunk, dst, get(part))
        return out
    raise AssertionError(rd.mapper)


def element_values(t: Task, chunk: Box, shapes, getters) -> np.ndarray:
    out = np.full(chunk.range, t.c0, dtype=np.int64)
    for rd in t.reads:
        out = out + contribution(rd, chunk, shapes[rd.buffer], getters[rd.buffer])
    idx = np.indices(chunk.range).sum(axis=0) + sum(chunk.min)
    return (out + idx) % MOD


def write_mask(chunk: Box) -> np.ndarray:
    """``write`` mode writes only every other element: the rest must keep its value."""
    return (np.indices(chunk.range).sum(axis=0) + sum(chunk.min)) % 2 == 0


# ---- sequential model ---------------------------------------------------------------
def run_model(p: Program) -> dict:
    bufs = [a.copy() for a in p.init]
    fences, sums, reds = [], [], [0] * p.num_reductions
    getters = [(lambda box, k=k: bufs[k][box.slices]) for k in range(len(bufs))]
    for t in p.tasks:
        if t.kind == "fence":
            fences.append(bufs[t.target].copy())
        elif t.kind == "host_sum":
            sums.append(int(bufs[t.reads[0].buffer].sum()))
        elif t.kind == "reduce":
            full = Box.full(p.shapes[t.write])
            reds[t.target] = int(element_values(t, full, p.shapes, getters).sum())
        else:
            full = Box.full(p.shapes[t.write])
            vals = element_values(t, full, p.shapes, getters)
            old = bufs[t.write]
            if t.mode == "read_write":
                new = (vals + old) % MOD
            elif t.mode == "write":
                new = np.where(write_mask(full), vals, old)
            else:
                new = vals
            bufs[t.write] = new.astype(np.int64)
    return {"buffers": bufs, "fences": fences, "sums": sums, "reductions": reds}


# ---- celeritas --------------------------------------------------------------------------
def run_celeritas(p: Program, q: cl.Queue) -> dict:
    bufs = [cl.Buffer(a, name=f"b{k}") for k, a in enumerate(p.init)]
    red_bufs = [cl.Buffer(shape=(1,), dtype=np.int64, name=f"r{k}") for k in range(p.num_reductions)]
    sums = cl.HostObject([])
    fence_futures = []
    for t in p.tasks:
        if t.kind == "fence":
            fence_futures.append(q.fence(bufs[t.target]))
            continue
        if t.kind == "host_sum":
            def cgf(cgh, t=t):
                acc = bufs[t.reads[0].buffer].access(cgh, cl.all(), cl.read)
                lst = cl.side_effect(sums, cgh)
                cgh.host_task(lambda part: lst.append(int(np.asarray(acc[...]).sum())), on=cl.on_master_node)
            q.submit(cgf)
            continue

        def cgf(cgh, t=t):
            shape = p.shapes[t.write]
            dims = len(shape)
            accs = {}
            for rd in t.reads:
                m = cl.neighborhood(*(1,) * dims) if rd.mapper == "neighborhood" else mapper_of(rd)
                accs.setdefault(rd.buffer, []).append(bufs[rd.buffer].access(cgh, m, cl.read))
            getters = {}
            for b, lst in accs.items():
                getters[b] = lambda box, lst=lst: _read_any(lst, box)
            reds = ()
            if t.kind == "reduce":
                reds = (cl.reduction(red_bufs[t.target], cgh, cl.plus, initialize_to_identity=True),)
            else:
                w = bufs[t.write].access(cgh, cl.one_to_one(), t.mode)

            @cgh.parallel_for(shape, reductions=reds, name=f"{t.kind}_{t.mode}")
            def kernel(chunk, *reducers):
                vals = element_values(t, chunk.box, p.shapes, getters)
                if reducers:
                    reducers[0].combine(vals)
                    return
                if t.mode == "read_write":
                    w[chunk] = (vals + w[chunk]) % MOD
                elif t.mode == "write":
                    cur = np.array(w[chunk])
                    w[chunk] = np.where(write_mask(chunk.box), vals, cur)
                else:
                    w[chunk] = vals

        q.submit(cgf)
    out = {"fences": [f.result() for f in fence_futures]}
    out["buffers"] = [q.fence(b).result() for b in bufs]
    out["reductions"] = [int(q.fence(b).result()[0]) for b in red_bufs]
    out["sums"] = q.fence(sums).result()
    return out


def _read_any(accessors, box: Box):
    """Several accessors of one buffer: the first whose granted region holds the box."""
    for a in accessors:
        reg = a.region
        if reg is not None and reg.contains(box):
            return a[box]
    return accessors[0][box]


def compare(got: dict, want: dict, rank: int = 0) -> None:
    assert len(got["fences"]) == len(want["fences"])
    for g, w in zip(got["fences"], want["fences"]):
        np.testing.assert_array_equal(g, w)
    for k, (g, w) in enumerate(zip(got["buffers"], want["buffers"])):
        np.testing.assert_array_equal(g, w, err_msg=f"buffer b{k}")
    assert got["reductions"] == want["reductions"]
    if rank == 0:   # master-node host tasks observe the buffers on rank 0 only
        assert got["sums"] == want["sums"]
    else:
        assert got["sums"] == []
