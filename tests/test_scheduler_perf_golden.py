"""Golden hashes of the task, command and instruction graph records of a set of programs.

The scheduler's hot paths are tuned for speed; these hashes pin the exact graphs (node ids,
kinds, boxes, regions, dependencies and their origins, pilots) that the generators produced
before the tuning, so an optimization that changes a graph's shape in any way fails here.
If a graph change is *intended* (a semantic fix), regenerate the values with
``python tests/test_scheduler_perf_golden.py`` and say why in the commit.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from celeritas import range_mappers as rm  # noqa: E402
from scheduler import task_graph as tg  # noqa: E402
from scheduler.geometry import Subrange  # noqa: E402

from graph_context import GraphContext  # noqa: E402

R, W, RW, DW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE


def _wave_sim(ctx: GraphContext, n: int = 64, steps: int = 12, split: str = "2d") -> None:
    up, u = ctx.buffer((n, n)), ctx.buffer((n, n), host_init=True)
    ctx.task((n, n), [(up, rm.one_to_one(), DW), (u, rm.one_to_one(), R)], split=split)
    for _ in range(steps):
        ctx.task((n, n), [(up, rm.one_to_one(), RW), (u, rm.neighborhood(1, 1, shape="along_axes"), R)],
                 split=split)
        up, u = u, up
    ctx.fence(u)


def _jacobi(ctx: GraphContext, n: int = 48, steps: int = 10) -> None:
    a, b = ctx.buffer((n, n), host_init=True), ctx.buffer((n, n))
    for _ in range(steps):
        ctx.task((n, n), [(a, rm.neighborhood(1, 1, shape="along_axes"), R), (b, rm.one_to_one(), DW)])
        a, b = b, a
    ctx.fence(a)


def _rich(ctx: GraphContext) -> None:
    """Reductions, host tasks (master node, collective), side effects, fences, growing reads,
    1-D neighborhoods, transposes, uninitialized reads, oversubscription, buffer destruction."""
    a = ctx.buffer((40,), host_init=True)
    b = ctx.buffer((40,))
    c = ctx.buffer((1,))
    m = ctx.buffer((12, 12), host_init=True)
    t = ctx.buffer((12, 12))
    for i in range(3):
        ctx.task((40,), [(a, rm.neighborhood(1), R), (b, rm.one_to_one(), DW)], oversubscribe=1 + i % 2)
        a, b = b, a
    ctx.task((40,), [(a, rm.one_to_one(), R)], reductions=[ctx.reduction(c)])
    ctx.task((1,), [(c, rm.all(), R)], kind=tg.MASTER_NODE, side_effects=[7])
    ctx.task((40,), [(a, rm.one_to_one(), R)], reductions=[ctx.reduction(c, include_current=True)])
    ctx.task((4,), [(a, rm.all(), R)], kind=tg.COLLECTIVE, collective_group=1)
    ctx.task((12, 12), [(m, rm.transposed(), R), (t, rm.one_to_one(), DW)], split="2d")
    ctx.task((12, 12), [(t, rm.slice(1), R), (m, rm.one_to_one(), RW)])
    for k in range(1, 5):   # growing accesses: resizes (or lookahead merges)
        ctx.task((1,), [(b, rm.fixed(Subrange((0,), (8 * k,))), RW)], kind=tg.HOST_COMPUTE, side_effects=[7])
    ctx.task((12,), [(m, rm.slice(0), R), (a, rm.even_split(), W)])
    ctx.fence(b)
    ctx.task((40,), [(b, rm.neighborhood(2), R), (a, rm.one_to_one(), RW)], collective_group=None)
    ctx.destroy_buffer(t)
    ctx.task((1,), [(c, rm.all(), R), (m, rm.all(), R)], kind=tg.HOST_COMPUTE)
    ctx.epoch(tg.EPOCH_BARRIER)
    ctx.task((40,), [(a, rm.one_to_one(), RW)])


_OPAQUE = frozenset(("launcher", "promise", "op", "identity"))
# an epoch's task-stream hash and digest: what the divergence check compares between ranks,
# not part of any graph (what a digest entry lists may grow without the graphs changing)
_NOT_GRAPH = frozenset(("stream_hash", "digest"))
# fields added after the hashes were taken (out-of-core labels): left out at their default
_LATER = frozenset(("evicts", "batch"))


def _instruction_fields(ins) -> str:
    """Every field of an instruction (records leave some out: allocation boxes, exact
    access regions, ...) except the opaque callables and promises and an epoch's divergence
    check payload."""
    return repr([(f.name, getattr(ins, f.name)) for f in dataclasses.fields(ins)
                 if f.name not in _OPAQUE and f.name not in _NOT_GRAPH
                 and not (f.name in _LATER and getattr(ins, f.name) == f.default)])


def _canonical(ctx: GraphContext) -> str:
    dump = {"tasks": ctx.tm.recorder.tasks,
            "commands": [c.recorder.commands for c in ctx.cdags],
            "instructions": {r: igg.recorder.instructions for r, igg in sorted(ctx.iggs.items())},
            "pilots": {r: igg.recorder.pilots for r, igg in sorted(ctx.iggs.items())},
            "fields": {r: [_instruction_fields(i) for i in ins] for r, ins in sorted(ctx.instructions.items())},
            "pilot_objects": {r: [repr(p) for p in ps] for r, ps in sorted(ctx.pilots.items())}}
    return json.dumps(dump, sort_keys=True, default=str)


# (program, ranks, devices, lookahead, compile ranks, peers)
SCENARIOS = {
    "wave_1x1": (_wave_sim, 1, 1, "auto", None, True),
    "wave_2x1": (_wave_sim, 2, 1, "auto", None, True),
    "wave_4x1_none": (_wave_sim, 4, 1, "none", None, True),
    "wave_1x4": (_wave_sim, 1, 4, "auto", None, True),
    "wave_2x2_nopeers": (_wave_sim, 2, 2, "none", None, False),
    "wave_16x2_1d": (lambda ctx: _wave_sim(ctx, split="1d"), 16, 2, "auto", [0, 5, 15], True),
    "wave_6x1": (_wave_sim, 6, 1, "auto", [0, 1, 4], True),
    "wave_128x4": (lambda ctx: _wave_sim(ctx, n=128, steps=5), 128, 4, "auto", [0, 77], True),
    "jacobi_1x1": (_jacobi, 1, 1, "auto", None, True),
    "jacobi_3x2": (_jacobi, 3, 2, "infinite", None, True),
    "jacobi_8x1_none": (_jacobi, 8, 1, "none", [0, 3, 7], True),
    "rich_1x1": (_rich, 1, 1, "none", None, True),
    "rich_1x3": (_rich, 1, 3, "auto", None, True),
    "rich_2x2": (_rich, 2, 2, "auto", None, False),
    "rich_3x1": (_rich, 3, 1, "none", None, True),
    "rich_4x2_inf": (_rich, 4, 2, "infinite", None, True),
}

GOLDEN = {
    'wave_1x1': 'b94f3499de202c5a2114717def82c660367c427208e22d2b03737fe2e5702d48',
    'wave_2x1': 'bfaf163d7047d6c08625e8a0109e1c1b371f517fdf1c7f00b1f7bc0639e687e9',
    'wave_4x1_none': '80f8da5736ed7c3e6594ee47e1e4c130e46f016bce8ee47f2d0dac04e9af9285',
    'wave_1x4': 'f4133c3f49cc3a1454a3de31bf2eb9014494e510b830baa1d8f2c44ce5206ade',
    'wave_2x2_nopeers': '591600eb98231cd6b7867602a0e07cc94f3c86b503311346a5f9da948a66316c',
    'wave_16x2_1d': 'd72abe372355f17de0f3fca798d55330b99d78c34a4e3acbe3a00b95cb5cea04',
    'wave_6x1': '6cc062ae9917ed76dd47a53734cd69dfd302cb26fa3c01c964a2ce509f7c331a',
    'wave_128x4': '64bbf1c291fd7b0d3e1019c69a0b02978e1f4a9d4d793ed26d1672ea47f47595',
    'jacobi_1x1': '58557b5876a5340003fa8d76573c877eb8dfef98afa4f28459792702c7adfaf4',
    'jacobi_3x2': 'f26d8797ea81e41fd533a6386fa2cc40b34fc653a12f2c16bbc707c3ea6160f4',
    'jacobi_8x1_none': '9b8e892939eb83bbb4af2ea38bac18dffd4d08ba2aac1b549506629392928e2c',
    'rich_1x1': '1443ee91398626cff52703231614034dab0336940594eb03900021ff1d966f98',
    'rich_1x3': '5f434c800f04c9b301f66eb3a59337aa8f195a8d961decf16ed148a1d66452b3',
    'rich_2x2': 'c67ba1a6df1f75b1f7e0d07bf13e9331736e556a63b478050c64faa9d0804abd',
    'rich_3x1': '2733c3df2057c89fa555b2390534c2c013cf5aef9728c7920f67f4d5e297c5f3',
    'rich_4x2_inf': 'f227a608f6628cac431a6067dc148aa67fa0ae597e8691aabc376aec475d331a',
}


def run_scenario(name: str) -> str:
    prog, ranks, devices, lookahead, compile_ranks, peers = SCENARIOS[name]
    ctx = GraphContext(ranks, devices=devices, lookahead=lookahead, diagnostics="off",
                       compile_ranks=compile_ranks, peers=peers)
    prog(ctx)
    ctx.finish()
    return hashlib.sha256(_canonical(ctx).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_graphs_unchanged(name):
    assert run_scenario(name) == GOLDEN[name]


if __name__ == "__main__":
    for name in SCENARIOS:
        print(f"    {name!r}: {run_scenario(name)!r},")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_graphs_validate(name):
    """The pinned graphs are also race-free, leak-free and lose no data (``ig_validator``)."""
    from ig_validator import validate
    prog, ranks, devices, lookahead, compile_ranks, peers = SCENARIOS[name]
    ctx = GraphContext(ranks, devices=devices, lookahead=lookahead, diagnostics="off",
                       compile_ranks=compile_ranks, peers=peers)
    prog(ctx)
    ctx.finish()
    for r in ctx.compile_ranks:
        validate(ctx, r)
