"""The execution trace (CELERITAS_TRACE): Chrome trace-event JSON that Perfetto loads."""
import json
from collections import Counter, defaultdict

import numpy as np
import pytest

import celeritas as cl
from celeritas import trace
from celeritas.graphs import GraphRecord
from celeritas.testing import run_cluster
from executor.executor import TraceEvent

from test_graphs import rich_program  # noqa: E402


def validate_chrome_trace(doc):
    """What Perfetto's JSON importer needs; returns the X events by pid."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    named_processes = set()
    named_threads = set()
    slices = defaultdict(list)
    flows = defaultdict(dict)
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "s", "f", "M"), e
        assert type(e["pid"]) is int and type(e["tid"]) is int, e
        assert isinstance(e["name"], str)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
            if e["name"] == "process_name":
                named_processes.add(e["pid"])
                assert isinstance(e["args"]["name"], str)
            elif e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
            assert isinstance(e["args"], dict)
            slices[e["pid"]].append(e)
        else:
            assert type(e["id"]) is int
            assert e["id"] not in flows[e["ph"]], "flow ids are unique"
            flows[e["ph"]][e["id"]] = e
            if e["ph"] == "f":
                assert e["bp"] == "e"
    assert set(flows["s"]) == set(flows["f"]), "every flow starts and finishes"
    for xs in slices.values():     # slices of one track never overlap (so they nest trivially)
        by_track = defaultdict(list)
        for x in xs:
            by_track[x["tid"]].append(x)
        for track in by_track.values():
            track.sort(key=lambda x: x["ts"])
            for a, b in zip(track, track[1:]):
                assert a["ts"] + a["dur"] <= b["ts"] + 1e-9, (a, b)
    for pid, xs in slices.items():
        assert pid in named_processes
        for x in xs:
            assert (pid, x["tid"]) in named_threads
    for fid, s in flows["s"].items():   # both ends bind to a slice on their track
        f = flows["f"][fid]
        for end in (s, f):
            assert any(x["tid"] == end["tid"] and x["ts"] <= end["ts"] <= x["ts"] + x["dur"] + 1e-6
                       for x in slices[end["pid"]]), end
    json.dumps(doc)
    return slices


@pytest.mark.timeout(120)
def test_cluster_trace_is_valid_and_complete(tmp_path):
    path = tmp_path / "out" / "trace.json"
    run_cluster(rich_program, nodes=2, devices=2, CELERITAS_TRACE=str(path),
                CELERITAS_PRINT_GRAPHS=str(tmp_path / "graphs"))
    doc = json.loads(path.read_text())
    slices = validate_chrome_trace(doc)
    assert sorted(slices) == [1, 2]                      # one process per rank
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    threads = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"device D0 lane 0", "device D1 lane 0", "alloc queue", "MPI (send / receive)"} <= threads
    for rank in (0, 1):
        rec = GraphRecord.from_json((tmp_path / "graphs" / f"instruction_graph_rank{rank}.json").read_text())
        xs = slices[rank + 1]
        # one slice per instruction, with its kind
        assert len(xs) == len(rec["instructions"])
        assert Counter(x["cat"] for x in xs) == Counter(i["kind"] for i in rec["instructions"])
        assert sorted(x["args"]["instruction"] for x in xs) == sorted(i["id"] for i in rec["instructions"])
        by_id = {x["args"]["instruction"]: x for x in xs}
        for i in rec["instructions"]:
            x = by_id[i["id"]]
            if "task" in i:
                assert x["args"]["task"] == i["task"]
            if i["kind"] in ("copy", "send") and i.get("size_bytes"):
                assert x["args"]["bytes"] == i["size_bytes"]
            if i["kind"] == "device_kernel":
                assert x["name"] == i["name"] and x["args"]["buffers"]
                assert x["args"]["task_name"] == i["name"]
    cats = Counter(e["cat"] for e in doc["traceEvents"] if e["ph"] == "s")
    assert cats["dependency"] > 0 and cats["transfer"] > 0
    transfer_pids = {(s["pid"], f["pid"])
                     for s in doc["traceEvents"] if s["ph"] == "s" and s["cat"] == "transfer"
                     for f in doc["traceEvents"] if f["ph"] == "f" and f["id"] == s["id"]}
    assert transfer_pids <= {(1, 2), (2, 1)} and transfer_pids


@pytest.mark.timeout(120)
def test_single_rank_trace(tmp_path, monkeypatch):
    path = tmp_path / "trace.json"
    monkeypatch.setenv("CELERITAS_TRACE", str(path))
    q = cl.Queue(record=True, devices="host:2")
    buf = cl.Buffer(np.zeros(8, np.float64), name="zeros")

    def inc(cgh):
        acc = buf.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((8,), lambda chunk: acc.__setitem__(chunk, acc[chunk] + 1), name="inc")

    for _ in range(6):
        q.submit(inc)
    assert q.fence(buf).result().sum() == 48
    rt = q.runtime
    q.shutdown()
    rec = GraphRecord.from_recorders(rt.recorders, rt.rank)
    slices = validate_chrome_trace(json.loads(path.read_text()))
    assert list(slices) == [1]
    assert len(slices[1]) == len(rec["instructions"]) == len(rt.executor.trace)
    kernels = [x for x in slices[1] if x["cat"] == "device_kernel"]
    assert len(kernels) == 12 and all(x["name"] == "inc" for x in kernels)
    assert all("B0 zeros" in x["args"]["buffers"] for x in kernels)


def _ev(iid, kind, lane, start, end, deps=(), **kw):
    return TraceEvent(iid, kind, kw.pop("name", ""), lane, start, end, deps=tuple(deps), **kw)


def _payload(rank, events, offset=0, host="h", pid=1):
    return {"rank": rank, "host": host, "pid": pid, "clock_offset_ns": offset,
            "events": [tuple(getattr(e, f) for f in trace._FIELDS) for e in events],
            "buffers": {0: "x"}, "task_names": {3: "k"}}


def test_build_trace_flows_and_clock():
    r0 = [_ev(0, "epoch", "immediate", 1000, 1100),
          _ev(1, "copy", "D0.lane0", 2000, 3000, deps=[0], buffers=(0,), bytes=64),
          _ev(2, "device_kernel", "D0.lane0", 3000, 9000, deps=[1], task=3, name="k", buffers=(0,)),
          _ev(3, "send", "comm", 9500, 12000, deps=[2], transfer=(4, 0, 0), peer=1, buffers=(0,), bytes=64),
          _ev(4, "horizon", "immediate", 12500, 12600, deps=[3])]
    r1 = [_ev(0, "epoch", "immediate", 1000, 1200),
          _ev(1, "receive", "comm", 1500, 13000, deps=[0], transfer=(4, 0, 0), buffers=(0,), bytes=64),
          _ev(2, "copy", "host.lane0", 13500, 14000, deps=[1])]
    doc = trace.build_trace([_payload(0, r0), None, _payload(1, r1)])
    slices = validate_chrome_trace(doc)
    assert [len(slices[1]), len(slices[2])] == [5, 3]
    xs = {(x["pid"], x["args"]["instruction"]): x for xs in slices.values() for x in xs}
    assert xs[(1, 0)]["ts"] == 0.0 and xs[(1, 2)]["ts"] == 2.0 and xs[(1, 2)]["dur"] == 6.0
    assert xs[(1, 2)]["name"] == "k" and xs[(1, 2)]["args"]["task_name"] == "k"
    assert xs[(1, 3)]["name"] == "send B0 x \u2192 R1" and xs[(1, 3)]["args"]["bytes"] == 64
    flows = [(e["cat"], e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] in "sf"]
    # kernel -> send crosses lanes; copy -> kernel does not; nothing into or out of epochs / horizons
    assert flows.count(("dependency", 1, xs[(1, 2)]["tid"])) == 1
    assert ("transfer", 1, xs[(1, 3)]["tid"]) in flows and ("transfer", 2, xs[(2, 1)]["tid"]) in flows
    assert sum(1 for c, *_ in flows if c == "dependency") == 4   # I2->I3 on rank 0, I1->I2 on rank 1
    # device lanes sort before host lanes, the alloc queue, MPI and immediate work
    assert trace.lane_order("D1.lane0") < trace.lane_order("host.lane0") < trace.lane_order("alloc") \
        < trace.lane_order("comm") < trace.lane_order("immediate")


def test_build_trace_aligns_processes_by_wall_clock():
    a = _payload(0, [_ev(0, "epoch", "immediate", 5_000, 6_000)], offset=1_000_000, host="a")
    b = _payload(1, [_ev(0, "epoch", "immediate", 900_000, 901_000)], offset=100_000, host="b")
    doc = trace.build_trace([a, b])
    xs = {e["pid"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    # wall clock: a at 1_005_000, b at 1_000_000
    assert xs[2]["ts"] == 0.0 and xs[1]["ts"] == 5.0
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0 (a)", "rank 1 (b)"}


def test_overlapping_slices_of_a_lane_get_their_own_rows():
    events = [_ev(0, "send", "comm", 0, 100), _ev(1, "receive", "comm", 50, 150),
              _ev(2, "send", "comm", 120, 130), _ev(3, "copy", "D0.lane0", 0, 10)]
    doc = trace.build_trace([_payload(0, events)])
    validate_chrome_trace(doc)
    threads = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert sorted(threads.values()) == ["MPI (send / receive)", "MPI (send / receive) #2", "device D0 lane 0"]
    tid = {e["args"]["instruction"]: e["tid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert tid[0] == tid[2] != tid[1]
