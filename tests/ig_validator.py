"""Checks an instruction graph for data races, cycles, leaks and lost data by replaying it per
element.  Lost data: an instruction reads an element of an allocation that nothing wrote since
the allocation was made, while the rank had the element's value (written, received or given by
the user) somewhere: a copy, receive or resize that should have brought it there is missing."""
from __future__ import annotations

import numpy as np

from scheduler import task_graph as tg
from scheduler.geometry import Box, Region
from scheduler.instruction_graph import USER_MEMORY


class _Alloc:
    def __init__(self, box: Box, creator: int, buffer: int | None = None):
        self.box = box
        self.creator = creator
        self.buffer = buffer
        shape = tuple(h - l for l, h in zip(box.lo, box.hi))
        self.writer = np.full(shape, creator, dtype=np.int64)
        self.readers: list[tuple[int, np.ndarray]] = []

    def mask(self, region) -> np.ndarray:
        m = np.zeros(self.writer.shape, dtype=bool)
        boxes = [region] if isinstance(region, Box) else list(region)
        for b in boxes:
            if b.empty:
                continue
            sl = tuple(slice(b.lo[i] - self.box.lo[i], b.hi[i] - self.box.lo[i]) for i in range(3))
            m[sl] = True
        return m


def validate(ctx, rank: int = 0) -> None:
    instrs = ctx.instructions[rank]
    pos = {}
    closure: dict[int, int] = {}   # instruction id -> bitset of predecessor positions
    for k, ins in enumerate(instrs):
        bits = 0
        for d in ins.dep_ids:
            assert d in pos, f"I{ins.id} ({ins.kind}) depends on I{d}, which comes later or never (cycle?)"
            bits |= closure[d] | (1 << pos[d])
        pos[ins.id] = k
        closure[ins.id] = bits
    allocs: dict[int, _Alloc] = {}
    split_dest: dict = {}
    known: dict[int, Region] = {}     # per buffer: the elements the rank has had a value of
    deferred: list = [None, {}]       # (task, its kernels' writes per buffer): known after them

    def settle(ins) -> None:
        if ins.kind in ("device_kernel", "host_task"):
            if ins.task == deferred[0]:
                return
        elif ins.kind in ("copy", "alloc", "free"):
            return
        for bid, part in deferred[1].items():
            had = known.get(bid)
            known[bid] = part if had is None else had | part
        deferred[0], deferred[1] = getattr(ins, "task", None), {}

    def before(a: int, b: int) -> bool:
        return a == b or (a in pos and bool(closure[b] >> pos[a] & 1))

    def read(ins, aid, region):
        if aid not in allocs or aid < 0:
            return
        al = allocs[aid]
        m = al.mask(region)
        for w in np.unique(al.writer[m]):
            if w >= 0:
                assert before(int(w), ins.id), f"I{ins.id} ({ins.kind}) reads A{aid} {region} before I{w} wrote it"
        if al.buffer is not None and al.creator >= 0:
            fresh = m & (al.writer == al.creator)
            if fresh.any():
                had = known.get(al.buffer)
                if had is not None:
                    lost = fresh & al.mask(had & al.box)
                    assert not lost.any(), (f"I{ins.id} ({ins.kind}) reads {int(lost.sum())} element(s) of A{aid} "
                                            f"(buffer B{al.buffer}) that nothing wrote there, though the rank had "
                                            f"their value: lost data")
        al.readers.append((ins.id, m))

    def write(ins, aid, region, define: bool = True):
        if aid not in allocs or aid < 0:
            return
        al = allocs[aid]
        m = al.mask(region)
        for w in np.unique(al.writer[m]):
            if w >= 0:
                assert before(int(w), ins.id), f"I{ins.id} ({ins.kind}) overwrites A{aid} {region} concurrently with writer I{w}"
        keep = []
        for r, rm in al.readers:
            if (rm & m).any():
                assert before(r, ins.id), f"I{ins.id} ({ins.kind}) overwrites A{aid} {region} before reader I{r} is done"
                rm = rm & ~m
            if rm.any():
                keep.append((r, rm))
        al.readers = keep
        al.writer[m] = ins.id
        if define and al.buffer is not None:
            part = (region if not isinstance(region, Box) else Region.from_box(region)) & al.box
            # (a chunk's writes are not values its task's other chunks read: those read what was
            # there before the task, so they count once the task's kernels are behind)
            into = deferred[1] if ins.kind in ("device_kernel", "host_task") else known
            had = into.get(al.buffer)
            into[al.buffer] = part if had is None else had | part

    users = _user_allocs(ctx, rank)
    seen = {aid for aid, _, _ in users}
    for ins in instrs:      # (user allocations of buffers destroyed by now: those copies read)
        if ins.kind == "copy" and ins.source_memory == USER_MEMORY and ins.source not in seen:
            seen.add(ins.source)
            users.append((ins.source, ins.source_box, ins.buffer))
    for aid, box, bid in users:
        allocs[aid] = _Alloc(box, -1, bid)
        known[bid] = Region.from_box(box)       # (the user's data)
    for ins in instrs:
        k = ins.kind
        settle(ins)
        if k == "alloc":
            allocs[ins.allocation] = _Alloc(ins.box, ins.id, ins.buffer)
        elif k == "free":
            al = allocs[ins.allocation]
            write(ins, ins.allocation, al.box, define=False)
            del allocs[ins.allocation]
        elif k == "copy":
            read(ins, ins.source, ins.box)
            write(ins, ins.dest, ins.box)
        elif k in ("device_kernel", "host_task"):
            for a in ins.accesses:
                reg = a.region if a.region is not None else a.box
                if a.mode in tg.CONSUMER_MODES:
                    read(ins, a.allocation, reg)
            for a in ins.accesses:
                reg = a.region if a.region is not None else a.box
                if a.mode in tg.PRODUCER_MODES:
                    write(ins, a.allocation, reg)
            for r in getattr(ins, "reductions", []):
                write(ins, r.allocation, allocs[r.allocation].box)
        elif k == "send":
            read(ins, ins.source, ins.box)
        elif k == "receive":
            write(ins, ins.dest, ins.region)
        elif k == "split_receive":
            write(ins, ins.dest, ins.region)
            split_dest[ins.transfer] = ins.dest
        elif k == "await_receive":
            write(ins, split_dest[ins.transfer], ins.region)
        elif k == "gather_receive":
            al = allocs[ins.dest]
            write(ins, ins.dest, Region.from_box(al.box) - Box((rank,), (rank + 1,)))
        elif k == "fill_identity":
            write(ins, ins.allocation, allocs[ins.allocation].box)
        elif k == "reduce":
            read(ins, ins.source, allocs[ins.source].box)
            if ins.include_dest:
                read(ins, ins.dest, allocs[ins.dest].box)
            write(ins, ins.dest, allocs[ins.dest].box)
        elif k == "fence":
            if ins.allocation is not None:
                read(ins, ins.allocation, allocs[ins.allocation].box)
    # everything allocated was freed or handed to a fence
    fenced = {i.allocation for i in instrs if i.kind == "fence" and i.allocation is not None}
    users = {a for a, _, _ in users}
    leaked = set(allocs) - fenced - users
    assert not leaked, f"allocations never freed: {sorted(leaked)}"


def _user_allocs(ctx, rank):
    igg = ctx.iggs[rank]
    out = []
    for b in igg._buffers.values():
        if b.user is not None:
            out.append((b.user.id, b.user.box, b.info.id))
    return out
