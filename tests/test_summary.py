"""The shutdown summary: counts agree with the records, lane times and starvation from the trace."""
import io
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from rich.console import Console

import celeritas as cl
from celeritas import summary
from celeritas.graphs import GraphRecord
from celeritas.outputs import RankOutputs
from celeritas.testing import run_cluster
from executor.executor import TraceEvent

from test_graphs import rich_program  # noqa: E402


def _check_against_records(numbers, rec, trace_events):
    instrs = rec["instructions"]
    assert numbers["instructions"] == len(instrs)
    assert numbers["instructions_by_kind"] == dict(Counter(i["kind"] for i in instrs))
    assert numbers["executed"] == len(trace_events) == len(instrs)
    assert numbers["tasks"] == len(rec["tasks"])
    assert numbers["tasks_by_kind"] == dict(Counter(t["kind"] for t in rec["tasks"]))
    assert numbers["bytes_copied"] == sum(i["size_bytes"] for i in instrs if i["kind"] == "copy")
    assert numbers["bytes_sent"] == sum(i["size_bytes"] for i in instrs if i["kind"] == "send")
    lanes = numbers["lanes"]
    assert sum(v["instructions"] for v in lanes.values()) == len(instrs)
    assert all(0 <= v["busy_ns"] <= numbers["window_ns"] for v in lanes.values())
    assert any(v["busy_ns"] > 0 for v in lanes.values())
    assert 0 <= numbers["starvation_ns"] <= numbers["idle_ns"] <= numbers["window_ns"]


@pytest.mark.timeout(120)
def test_single_rank_summary_matches_records(monkeypatch, capsys):
    monkeypatch.setenv("CELERITAS_SUMMARY", "1")
    q = cl.Queue(record=True, devices="host:2")
    a = cl.Buffer(np.arange(64, dtype=np.float32), name="a")
    b = cl.Buffer(shape=(64,), dtype=np.float32, name="b")

    def shift(cgh):
        r = a.access(cgh, cl.neighborhood(1), cl.read)
        w = b.access(cgh, cl.one_to_one(), cl.discard_write)
        cgh.parallel_for((64,), lambda chunk: w.__setitem__(chunk, r[chunk] * 2), name="shift")

    q.submit(shift)
    assert q.fence(b).result()[3] == 6
    rt = q.runtime
    q.shutdown()
    err = capsys.readouterr().err
    assert "celeritas summary (1 rank)" in err and "instructions by kind" in err
    assert "busy time per lane" in err and "executor starvation" in err
    numbers = summary.summary_numbers(rt.outputs())
    assert numbers["ranks"] == 1
    (mine,) = numbers["per_rank"]
    _check_against_records(mine, GraphRecord.from_recorders(rt.recorders, rt.rank), rt.executor.trace)
    assert mine["replay"]["instruction"]["first"] > 0     # replay counters reach the summary
    assert "replay, instruction graph" in err
    assert numbers["bytes_copied"] == mine["bytes_copied"] > 0 and numbers["bytes_sent"] == 0
    assert {"D0.lane0", "D1.lane0", "alloc", "immediate"} <= set(mine["lanes"])
    # starvation measured from the scheduler's own busy intervals, not estimated
    intervals = rt.scheduler.busy_intervals
    assert intervals and all(a <= b for a, b in intervals)
    assert sum(b - a for a, b in intervals) == rt.scheduler.busy_ns
    assert not mine["starvation_estimated"]
    assert 0 <= mine["starvation_ns"] <= min(mine["idle_ns"], mine["scheduler_busy_ns"])
    assert "(est.)" not in err


@pytest.mark.timeout(120)
def test_cluster_summary_per_rank(capfd):
    def program(rank):
        rt = rich_program(rank)[2]
        assert rt.is_shut_down
        return summary.rank_numbers(rt.outputs()), GraphRecord.from_recorders(rt.recorders, rt.rank), rt.executor.trace

    res = run_cluster(program, nodes=2, devices=2, CELERITAS_SUMMARY="1", CELERITAS_RECORD="1")
    for numbers, rec, events in res:
        _check_against_records(numbers, rec, events)
        assert numbers["bytes_sent"] > 0
    combined = summary.combine([r[0] for r in res])
    assert combined["ranks"] == 2
    assert combined["instructions"] == sum(len(r[1]["instructions"]) for r in res)
    assert combined["bytes_sent"] == sum(r[0]["bytes_sent"] for r in res)
    assert combined["instructions_by_kind"]["device_kernel"] == \
        sum(1 for r in res for i in r[1]["instructions"] if i["kind"] == "device_kernel")
    err = capfd.readouterr().err
    assert err.count("celeritas summary (2 ranks)") == 1      # rank 0 prints, once


@pytest.mark.timeout(120)
def test_summary_off_by_default(monkeypatch, capsys):
    monkeypatch.delenv("CELERITAS_SUMMARY", raising=False)
    monkeypatch.delenv("CELERITAS_LOG_LEVEL", raising=False)
    q = cl.Queue()
    assert q.runtime.scheduler.busy_intervals is None      # nothing recorded when nobody reads it
    q.wait()
    assert not summary.enabled(q.runtime.config)
    q.shutdown()
    assert "celeritas summary" not in capsys.readouterr().err


def test_enabled_by_log_level():
    for level, on in (("info", True), ("debug", True), ("warning", False), ("error", False)):
        assert summary.enabled(SimpleNamespace(summary=False, log_level=level)) is on


def test_interval_arithmetic():
    assert summary._union([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert summary._gaps([(0, 3), (5, 8)], 0, 10) == [(3, 5), (8, 10)]
    assert summary._overlap([(3, 5), (8, 10)], [(4, 9)]) == 2


def _fake_runtime(events, busy_ns, intervals=None, counts=None):
    """A hand-made outputs view: the summary reads nothing else."""
    return RankOutputs(rank=0, trace=events, instruction_counts=counts or {}, scheduler_busy_ns=busy_ns,
                       scheduler_busy_intervals=intervals, num_tasks=3, summary=True)


def _events():
    # lane busy 0-10 and 60-100 (D0), 5-20 (comm): idle 20-60 of a 100 ns window
    return [TraceEvent(0, "device_kernel", "k", "D0.lane0", 0, 10),
            TraceEvent(1, "send", "", "comm", 5, 20, bytes=8),
            TraceEvent(2, "copy", "", "D0.lane0", 60, 100, bytes=16)]


def test_starvation_from_scheduler_intervals():
    n = summary.rank_numbers(_fake_runtime(_events(), busy_ns=999, intervals=[(30, 50), (55, 70)],
                                           counts={"copy": 1, "send": 1, "device_kernel": 1}))
    assert n["window_ns"] == 100 and n["idle_ns"] == 40
    assert n["starvation_ns"] == 25 and not n["starvation_estimated"]   # 30-50 and 55-60
    assert n["starvation"] == pytest.approx(0.25)
    assert n["lanes"]["D0.lane0"]["busy_ns"] == 50 and n["lanes"]["comm"]["busy_ns"] == 15
    assert n["bytes_copied"] == 16 and n["bytes_sent"] == 8 and n["instructions"] == 3


def test_starvation_estimate_and_warning():
    n = summary.rank_numbers(_fake_runtime(_events(), busy_ns=30))
    assert n["starvation_ns"] == 30 and n["starvation_estimated"]
    numbers = summary.combine([n])
    assert numbers["starvation_warning"]
    out = io.StringIO()
    summary.render(numbers, Console(file=out, width=140))
    text = out.getvalue()
    assert "warning" in text and "up to 30 %" in text and "30.0 % (est.)" in text
    calm = summary.combine([summary.rank_numbers(_fake_runtime(_events(), busy_ns=5))])
    out = io.StringIO()
    summary.render(calm, Console(file=out, width=140))
    assert not calm["starvation_warning"] and "warning" not in out.getvalue()


def test_render_without_trace_says_so():
    numbers = summary.combine([summary.rank_numbers(_fake_runtime([], busy_ns=5, counts={"epoch": 2}))])
    out = io.StringIO()
    summary.render(numbers, Console(file=out, width=140))
    assert "need the execution trace" in out.getvalue() and numbers["bytes_copied"] is None


@pytest.mark.parametrize("traced", [True, False])
def test_titles_do_not_wrap_in_an_80_column_terminal(traced):
    # narrow tables ("tasks | 3") used to wrap their titles over two lines
    n = summary.rank_numbers(_fake_runtime(_events() if traced else [], busy_ns=30, counts={"epoch": 2}))
    numbers = summary.combine([n])
    out = io.StringIO()
    summary.render(numbers, Console(file=out, width=80))
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    titles = ["celeritas summary (1 rank)", "instructions by kind"]
    if traced:
        titles += ["busy time per lane", "executor starvation"]
    for title in titles:
        assert title in lines, (title, lines)
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    if not traced:
        assert "need the execution trace" in out.getvalue()


@pytest.mark.timeout(120)
def test_the_summary_counts_a_tasks_commands_replayed_together(capfd):
    """On two ranks a stencil step is an execution, a push and an await-push per rank:
    once it repeats, they replay as one template, which the summary's instruction replay
    row counts among its replays."""
    def program(rank):
        q = cl.Queue()
        up = cl.Buffer(np.zeros((32, 32), np.float32))
        u = cl.Buffer(np.ones((32, 32), np.float32))
        for _ in range(40):
            def step(cgh, up=up, u=u):
                w = up.access(cgh, cl.one_to_one(), cl.read_write)
                r = u.access(cgh, cl.neighborhood(1, 1, shape="along_axes"), cl.read)

                @cgh.parallel_for(up.shape)
                def kernel(chunk):
                    w[chunk] = r[chunk] + 1
            q.submit(step)
            up, u = u, up
        got = q.fence(u).result()
        q.shutdown()
        return got, summary.rank_numbers(q.runtime.outputs())

    res = run_cluster(program, nodes=2, devices=1, CELERITAS_SUMMARY="1")
    for got, numbers in res:
        assert np.all(got == 41)     # (u starts at 1: one more per step)
        rp = numbers["replay"]["instruction"]
        assert rp["grouped"] >= 20 and rp["hits"] >= rp["grouped"], rp
    err = " ".join(capfd.readouterr().err.replace("│", " ").split())    # (rich wraps the row)
    assert "of them a task's commands together)" in err


def test_the_summary_counts_a_tasks_commands_with_reductions_replayed_together(capfd):
    """A step that also reduces into a residual, read by a host task on the master node:
    the summary's instruction replay row says how many replays of a task's commands
    together had the task's reductions and how many gathered partial results."""
    def program(rank):
        q = cl.Queue()
        up = cl.Buffer(np.zeros((32, 32), np.float32))
        u = cl.Buffer(np.ones((32, 32), np.float32))
        res = cl.Buffer(np.zeros((1,), np.float32))
        seen = []
        for _ in range(40):
            def step(cgh, up=up, u=u):
                w = up.access(cgh, cl.one_to_one(), cl.read_write)
                r = u.access(cgh, cl.neighborhood(1, 1, shape="along_axes"), cl.read)
                red = cl.reduction(res, cgh, cl.maximum, initialize_to_identity=True)

                @cgh.parallel_for(up.shape, reductions=[red])
                def kernel(chunk, top):
                    w[chunk] = r[chunk] + 1
                    top.combine(w[chunk].max())
            q.submit(step)

            def read(cgh):
                a = res.access(cgh, cl.all(), cl.read)
                cgh.host_task(lambda part: seen.append(float(a[0])), on=cl.on_master_node)
            q.submit(read)
            up, u = u, up
        q.wait()
        q.shutdown()
        return seen, summary.rank_numbers(q.runtime.outputs())

    res = run_cluster(program, nodes=2, devices=1, CELERITAS_SUMMARY="1")
    seen = res[0][0]
    assert seen == [float(k + 2) for k in range(40)], seen   # (u starts at 1: step k writes k + 2)
    for _seen, numbers in res:
        rp = numbers["replay"]["instruction"]
        assert rp["grouped_reductions"] >= 20 and rp["grouped"] >= rp["grouped_reductions"], rp
    assert res[0][1]["replay"]["instruction"]["grouped_gathers"] >= 20, res[0][1]["replay"]
    err = " ".join(capfd.readouterr().err.replace("│", " ").split())
    assert "with the task's reductions, " in err and "gathering partial results)" in err, err
