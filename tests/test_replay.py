"""Replay of repeating steps is exact: every graph is the same with replay on and off.

Each program is compiled twice through the synchronous test context, once with the
generators' replay memos and once without, and the full dumps (every record and every
field of every instruction and pilot) must be identical.  The programs are the golden
scenarios, steady-state loops long enough for many hits, and random programs.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celeritas import range_mappers as rm
from scheduler import task_graph as tg

from graph_context import GraphContext
from test_scheduler_perf_golden import SCENARIOS, _canonical

R, W, RW, DW = tg.READ, tg.WRITE, tg.READ_WRITE, tg.DISCARD_WRITE


def _compile(prog, ranks, devices, lookahead, compile_ranks, peers, replay, **kw):
    ctx = GraphContext(ranks, devices=devices, lookahead=lookahead, diagnostics="off",
                       compile_ranks=compile_ranks, peers=peers, replay=replay, **kw)
    prog(ctx)
    ctx.finish()
    return ctx


def _replays(ctx) -> dict:
    out = {"task": ctx.tm.replay.stats()}
    return out


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_programs_are_identical_with_replay(name):
    prog, ranks, devices, lookahead, compile_ranks, peers = SCENARIOS[name]
    off = _compile(prog, ranks, devices, lookahead, compile_ranks, peers, False)
    on = _compile(prog, ranks, devices, lookahead, compile_ranks, peers, True)
    assert _canonical(on) == _canonical(off)


def _stencil(ctx, n=32, steps=40, split="2d", extra=False):
    up, u = ctx.buffer((n, n), host_init=True), ctx.buffer((n, n), host_init=True)
    s = ctx.buffer((1,))
    for i in range(steps):
        ctx.task((n, n), [(up, rm.one_to_one(), RW), (u, rm.neighborhood(1, 1, shape="along_axes"), R)],
                 split=split)
        if extra and i % 3 == 0:
            ctx.task((n, n), [(u, rm.one_to_one(), R)], reductions=[ctx.reduction(s)])
            ctx.task((1,), [(s, rm.all(), R)], kind=tg.MASTER_NODE, side_effects=[1])
        up, u = u, up
    ctx.fence(u)


@pytest.mark.parametrize("ranks,devices,lookahead", [(1, 1, "auto"), (2, 1, "none"), (1, 4, "auto"),
                                                     (2, 2, "infinite"), (4, 2, "auto")])
@pytest.mark.parametrize("extra", [False, True])
def test_steady_state_loops_hit_and_stay_identical(ranks, devices, lookahead, extra):
    prog = lambda ctx: _stencil(ctx, extra=extra)  # noqa: E731
    off = _compile(prog, ranks, devices, lookahead, None, True, False)
    on = _compile(prog, ranks, devices, lookahead, None, True, True)
    assert _canonical(on) == _canonical(off)
    stats = _replays(on)
    for level, st_ in stats.items():
        assert st_["hits"] > st_["misses"], (level, stats)
