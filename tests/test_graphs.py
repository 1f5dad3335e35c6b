"""Graph records as Graphviz DOT and JSON: the shutdown dump, the record methods, rendering."""
import json
import shutil
from collections import Counter

import numpy as np
import pydot
import pytest

import celeritas as cl
from celeritas import graphs
from celeritas.graphs import GraphRecord
from celeritas.__main__ import render_folder
from celeritas.testing import run_cluster

# pydot's grammar still uses pyparsing's camelCase names
pytestmark = pytest.mark.filterwarnings(r"ignore:'\w+' deprecated - use:DeprecationWarning")


def rich_program(rank):
    """Kernels with ghost zones, a reduction, host tasks (master node, collective), fences:
    every command kind and most instruction kinds."""
    q = cl.Queue()
    a = cl.Buffer(np.arange(32, dtype=np.float32), name="a")
    b = cl.Buffer(shape=(32,), dtype=np.float32, name="b<&>")
    total = cl.Buffer(shape=(1,), dtype=np.float32, name="total")
    log = cl.HostObject([])
    for _ in range(3):
        src, dst = a, b

        def step(cgh, src=src, dst=dst):
            r = src.access(cgh, cl.neighborhood(1), cl.read)
            w = dst.access(cgh, cl.one_to_one(), cl.discard_write)

            @cgh.parallel_for((32,), name="stencil")
            def kernel(chunk):
                w[chunk] = r[chunk] + 1

        q.submit(step)
        a, b = b, a

    def reduce(cgh):
        r = a.access(cgh, cl.one_to_one(), cl.read)
        red = cl.reduction(total, cgh, cl.plus, initialize_to_identity=True)

        @cgh.parallel_for((32,), name="sum", reductions=(red,))
        def kernel(chunk, red):
            red.combine(r[chunk])

    q.submit(reduce)

    def show(cgh):
        r = total.access(cgh, cl.all(), cl.read)
        lines = cl.side_effect(log, cgh)
        cgh.host_task(lambda part: lines.append(float(r[...][0])), on=cl.on_master_node, name="print")

    q.submit(show)

    def collective(cgh):
        r = a.access(cgh, cl.all(), cl.read)
        cgh.host_task(lambda part: part.comm.barrier(), on=cl.collective, name="coll")

    q.submit(collective)
    out = q.fence(a).result()
    result = out.sum(), q.fence(total).result()[0], q.runtime
    q.shutdown()    # while the buffers are alive: their names are in the dump whatever the runtime kept
    return result


def _dot(path):
    (g,) = pydot.graph_from_dot_file(str(path))
    return g


def _all_nodes(g):
    """Node names of a pydot graph, subgraphs included, minus the default-attribute pseudo nodes."""
    names = set()
    stack = [g]
    while stack:
        s = stack.pop()
        names.update(n.get_name().strip('"') for n in s.get_nodes())
        stack.extend(s.get_subgraphs())
    return names - {"graph", "node", "edge"}


def _all_edges(g):
    out = []
    stack = [g]
    while stack:
        s = stack.pop()
        out.extend(s.get_edges())
        stack.extend(s.get_subgraphs())
    return out


def _edge_class(e):
    return (e.get("class") or "").strip('"')


@pytest.mark.timeout(120)
def test_cluster_dump_writes_every_graph(tmp_path):
    res = run_cluster(rich_program, nodes=2, devices=2, CELERITAS_PRINT_GRAPHS=str(tmp_path))
    expected = np.arange(32, dtype=np.float32) + 3
    assert all(r[0] == expected.sum() and r[1] == expected.sum() for r in res)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["command_graph.dot", "command_graph.json", "instruction_graph_rank0.dot",
                     "instruction_graph_rank0.json", "instruction_graph_rank1.dot", "instruction_graph_rank1.json",
                     "task_graph.dot", "task_graph.json"]

    # task graph: one node per task, one edge per dependency, buffer names in the labels
    trec = GraphRecord.from_json((tmp_path / "task_graph.json").read_text())
    assert set(trec) == set(GraphRecord.KEYS)
    g = _dot(tmp_path / "task_graph.dot")
    assert _all_nodes(g) == {f"T{t['id']}" for t in trec["tasks"]}
    assert len(_all_edges(g)) == sum(len(t["deps"]) for t in trec["tasks"])
    text = (tmp_path / "task_graph.dot").read_text()
    assert "&quot;b&lt;&amp;&gt;&quot;" in text and "&quot;a&quot;" in text
    assert "stencil" in text and "coll" in text
    kinds = Counter(t["kind"] for t in trec["tasks"])
    assert kinds["device_compute"] == 4 and kinds["master_node"] == 1 and kinds["collective"] == 1
    assert kinds["horizon"] >= 1

    # command graph: all ranks merged; rank keys are strings in JSON, ints in Python
    raw = json.loads((tmp_path / "command_graph.json").read_text())
    assert set(raw["commands"]) == {"0", "1"}
    crec = GraphRecord.from_json((tmp_path / "command_graph.json").read_text())
    assert set(crec["commands"]) == {0, 1}
    g = _dot(tmp_path / "command_graph.dot")
    assert _all_nodes(g) == {f"R{r}_C{c['id']}" for r, cs in crec["commands"].items() for c in cs}
    edges = _all_edges(g)
    deps = [e for e in edges if _edge_class(e).startswith("dep")]
    assert len(deps) == sum(len(c["deps"]) for cs in crec["commands"].values() for c in cs)
    transfers = [e for e in edges if _edge_class(e) == "transfer"]
    assert len(deps) + len(transfers) == len(edges)
    assert transfers, "pushes are joined to the await-pushes on the other rank"
    for e in transfers:
        assert e.get_source().split("_")[0] != e.get_destination().split("_")[0]
    ckinds = Counter(c["kind"] for cs in crec["commands"].values() for c in cs)
    assert {"execution", "push", "await_push", "reduction", "fence", "horizon", "epoch"} <= set(ckinds)
    for cs in crec["commands"].values():   # every dependency target is in the record
        ids = {c["id"] for c in cs}
        assert all(d["id"] in ids for c in cs for d in c["deps"])

    # instruction graphs: one node per instruction, one edge per dependency, pilots by their sends
    for rank in (0, 1):
        path = tmp_path / f"instruction_graph_rank{rank}.dot"
        irec = GraphRecord.from_json(path.with_suffix(".json").read_text())
        assert list(irec["commands"]) == [rank]
        g = _dot(path)
        nodes = _all_nodes(g)
        instrs = irec["instructions"]
        ids = {i["id"] for i in instrs}
        assert {n for n in nodes if n.startswith("I")} == {f"I{i}" for i in ids}
        assert {n for n in nodes if n.startswith("P")} == {f"P{p['msg_id']}" for p in irec["pilots"]}
        assert all(d["id"] in ids for i in instrs for d in i["deps"])
        edges = _all_edges(g)
        deps = [e for e in edges if _edge_class(e).startswith("dep")]
        assert len(deps) == sum(len(i["deps"]) for i in instrs)
        assert {(e.get_source(), e.get_destination()) for e in deps} == \
            {(f"I{d['id']}", f"I{i['id']}") for i in instrs for d in i["deps"]}
        pilot_edges = [e for e in edges if _edge_class(e) == "pilot"]
        sends = {i["msg_id"]: i["id"] for i in instrs if i["kind"] == "send"}
        assert sends, "each rank sends something in this program"
        assert {(e.get_source(), e.get_destination()) for e in pilot_edges} == \
            {(f"P{m}", f"I{i}") for m, i in sends.items()}
        assert len(deps) + len(pilot_edges) == len(edges)
        ikinds = Counter(i["kind"] for i in instrs)
        assert {"alloc", "free", "copy", "device_kernel", "host_task", "send", "reduce",
                "horizon", "epoch", "fence"} <= set(ikinds)
        # the reduction is read by a master-node task: only rank 0 gathers the partials
        assert ("fill_identity" in ikinds) == (rank == 0)
        text = path.read_text()
        assert "&quot;total&quot;" in text and "MSG" in text


@pytest.mark.timeout(120)
def test_record_methods_single_rank():
    q = cl.Queue(record=True, devices="host:2")
    buf = cl.Buffer(np.arange(16, dtype=np.int32), name="data")

    def twice(cgh):
        acc = buf.access(cgh, cl.one_to_one(), cl.read_write)

        @cgh.parallel_for((16,), name="twice")
        def kernel(chunk):
            acc[chunk] = acc[chunk] * 2

    q.submit(twice)
    q.submit(twice)
    assert list(q.fence(buf).result()) == list(np.arange(16) * 4)
    rec = q.graphs()
    q.shutdown()
    assert isinstance(rec, GraphRecord)
    again = GraphRecord.from_json(rec.to_json())
    assert again == rec
    names = {buf.id: "data"}
    for dot, prefix, count in ((rec.to_dot_tasks(names), "T", len(rec["tasks"])),
                               (rec.to_dot_commands(names), "R0_C", len(rec["commands"][0])),
                               (rec.to_dot_instructions(names), "I", len(rec["instructions"]))):
        (g,) = pydot.graph_from_dot_data(dot)
        assert len([n for n in _all_nodes(g) if n.startswith(prefix)]) == count
        assert "&quot;data&quot;" in dot
    # the second kernel overwrites what the first read and wrote: a true dependency in the task graph
    t1, t2 = [t for t in rec["tasks"] if t["name"] == "twice"]
    assert {"id": t1["id"], "kind": "true", "origin": "dataflow"} in t2["deps"]
    assert 'rank 0' in rec.to_dot_instructions(names)


def test_dependency_styles():
    rec = GraphRecord(tasks=[
        {"id": 0, "kind": "epoch", "name": "init", "range": [], "deps": [], "accesses": [], "action": "init"},
        {"id": 1, "kind": "device_compute", "name": "w", "range": [8], "offset": [0],
         "deps": [{"id": 0, "kind": "true", "origin": "last_epoch"}],
         "accesses": [{"buffer": 0, "mode": "discard_write", "region": [[[0], [8]]]}]},
        {"id": 2, "kind": "collective", "name": "c", "range": [2], "offset": [0], "collective_group": 1,
         "deps": [{"id": 1, "kind": "anti", "origin": "dataflow"}], "accesses": []},
        {"id": 3, "kind": "collective", "name": "c", "range": [2], "offset": [0], "collective_group": 1,
         "deps": [{"id": 2, "kind": "true", "origin": "collective_group_serialization"}], "accesses": []},
        {"id": 4, "kind": "horizon", "name": "horizon", "range": [], "accesses": [],
         "deps": [{"id": 3, "kind": "true", "origin": "execution_front"}]},
    ])
    (g,) = pydot.graph_from_dot_data(rec.to_dot_tasks({0: "x"}))
    style = {(e.get_source(), e.get_destination()): (e.get("color"), e.get("style")) for e in _all_edges(g)}
    assert style[("T0", "T1")][0].strip('"') == "orchid"
    assert [s.strip('"') for s in style[("T1", "T2")]] == ["limegreen", "dashed"]
    assert style[("T2", "T3")][0].strip('"') == "blue"
    assert style[("T3", "T4")][0].strip('"') == "orange"
    text = rec.to_dot_tasks({0: "x"})
    assert "in CG1" in text and "[0:8]" in text and 'B0 &quot;x&quot;' in text


def test_instruction_labels_cover_every_kind():
    box = [[0], [4]]
    instrs = [
        {"id": 0, "kind": "epoch", "deps": [], "task": 0, "action": "init"},
        {"id": 1, "kind": "alloc", "deps": [{"id": 0, "origin": "last_epoch"}], "allocation": 1, "memory": 2,
         "buffer": 0, "box": box, "size_bytes": 16},
        {"id": 2, "kind": "alloc", "deps": [{"id": 0, "origin": "last_epoch"}], "allocation": 2, "memory": 1,
         "buffer": None, "box": None, "size_bytes": 8},
        {"id": 3, "kind": "copy", "deps": [{"id": 1, "origin": "write"}], "source": 0, "dest": 1,
         "source_memory": 0, "dest_memory": 2, "buffer": 0, "box": box, "layout": "strided", "size_bytes": 16},
        {"id": 4, "kind": "device_kernel", "deps": [{"id": 3, "origin": "read"}], "device": 0, "task": 1,
         "box": box, "accesses": [{"buffer": 0, "allocation": 1, "box": box, "mode": "read"}], "name": "k"},
        {"id": 5, "kind": "host_task", "deps": [{"id": 4, "origin": "read"}], "task": 2, "box": box,
         "accesses": [], "name": "h", "collective_group": 3},
        {"id": 6, "kind": "send", "deps": [{"id": 4, "origin": "read"}], "to": 1, "msg_id": 7,
         "transfer": [2, 0, 0], "box": box, "size_bytes": 16},
        {"id": 7, "kind": "receive", "deps": [{"id": 2, "origin": "write"}], "transfer": [2, 0, 0],
         "region": [box, [[8], [12]]], "size_bytes": 32},
        {"id": 8, "kind": "split_receive", "deps": [], "transfer": [3, 0, 0], "region": [box], "size_bytes": 16},
        {"id": 9, "kind": "await_receive", "deps": [{"id": 8, "origin": "split_receive"}], "transfer": [3, 0, 0],
         "region": [box]},
        {"id": 10, "kind": "gather_receive", "deps": [], "transfer": [4, 0, 1], "chunk_bytes": 4},
        {"id": 11, "kind": "fill_identity", "deps": [], "reduction": 1, "count": 2},
        {"id": 12, "kind": "reduce", "deps": [{"id": 11, "origin": "write"}], "reduction": 1, "count": 2},
        {"id": 13, "kind": "fence", "deps": [], "task": 5},
        {"id": 14, "kind": "destroy_host_object", "deps": [{"id": 5, "origin": "side_effect"}], "host_object": 0},
        {"id": 15, "kind": "clone_collective_group", "deps": [], "original": 0, "new": 3},
        {"id": 16, "kind": "free", "deps": [{"id": 4, "origin": "allocation_lifetime"}], "allocation": 1},
        {"id": 17, "kind": "horizon", "deps": [{"id": 16, "origin": "execution_front"}], "task": 6},
    ]
    pilots = [{"msg_id": 7, "to": 1, "transfer": [2, 0, 0], "box": box},
              {"msg_id": 8, "to": 1, "transfer": [4, 0, 1], "box": [[0], [0]]}]
    rec = GraphRecord(tasks=[{"id": 1, "kind": "device_compute", "name": "k", "deps": [], "accesses": []}],
                      commands={1: []}, instructions=instrs, pilots=pilots)
    dot = rec.to_dot_instructions({0: "buf"})
    (g,) = pydot.graph_from_dot_data(dot)
    nodes = _all_nodes(g)
    assert {f"I{i['id']}" for i in instrs} | {"P7", "P8"} == nodes
    for needle in ("alloc</b> A1 on M2 D0", "scratch", "from A0 (M0 user)", "to A1 (M2 D0)", "device kernel</b> k",
                   "in CG3", "to R1 MSG7", "{[0:4], [8:12]}", "split receive", "await receive", "gather receive",
                   "T4.B0.R1", "fill identity</b> R1 x2", "destroy</b> H0", "CG0 &#8594; CG3",
                   "free</b> A1 (M2 D0)", "epoch</b> (init)", "horizon", "Instruction graph of rank 1"):
        assert needle in dot, needle
    assert len([e for e in _all_edges(g) if _edge_class(e) == "pilot"]) == 1   # P8 has no send


def test_box_and_region_formatting():
    assert graphs.fmt_box([[0, 2], [4, 8]]) == "[0:4, 2:8]"
    assert graphs.fmt_box([[], []]) == "[]"
    assert graphs.fmt_region([]) == "(empty)"
    assert graphs.fmt_region([[[1], [2]]]) == "[1:2]"


def test_from_json_rejects_other_documents():
    with pytest.raises(ValueError):
        GraphRecord.from_json('{"tasks": []}')


def test_render_folder_reports_missing_graphviz(tmp_path, monkeypatch, capsys):
    (tmp_path / "task_graph.dot").write_text("digraph G { a -> b; }\n")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert render_folder(tmp_path) == 1
    err = capsys.readouterr().err
    assert "apt-get install graphviz" in err and "brew install graphviz" in err
    assert not (tmp_path / "task_graph.svg").exists()


def test_render_folder_errors(tmp_path, capsys):
    assert render_folder(tmp_path / "missing") == 2
    assert render_folder(tmp_path) == 1
    assert "no .dot files" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_render_folder_renders_svg(tmp_path):
    rec = GraphRecord(tasks=[{"id": 0, "kind": "epoch", "name": "init", "deps": [], "accesses": []},
                             {"id": 1, "kind": "host_compute", "name": "x<y>", "range": [4], "offset": [0],
                              "deps": [{"id": 0, "kind": "true", "origin": "last_epoch"}], "accesses": []}])
    (tmp_path / "task_graph.dot").write_text(rec.to_dot_tasks())
    (tmp_path / "broken.dot").write_text("digraph G { a -> ; }\n")
    assert render_folder(tmp_path) == 1      # the broken one fails, the good one is rendered
    svg = (tmp_path / "task_graph.svg").read_text()
    assert "<svg" in svg and "x&lt;y&gt;" in svg
    (tmp_path / "broken.dot").unlink()
    assert render_folder(tmp_path) == 0


@pytest.mark.timeout(120)
def test_dry_run_dump_has_rank0_only(tmp_path, monkeypatch):
    monkeypatch.setenv("CELERITAS_DRY_RUN_NODES", "4")
    monkeypatch.setenv("CELERITAS_PRINT_GRAPHS", str(tmp_path))
    q = cl.Queue()
    buf = cl.Buffer(np.ones(64, np.float32), name="ones")

    def cgf(cgh):
        acc = buf.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((64,), lambda chunk: None, name="k")

    q.submit(cgf)
    q.fence(buf).result()
    q.shutdown()
    crec = GraphRecord.from_json((tmp_path / "command_graph.json").read_text())
    assert list(crec["commands"]) == [0]
    assert (tmp_path / "instruction_graph_rank0.dot").exists()
    assert not (tmp_path / "instruction_graph_rank1.dot").exists()
    (g,) = pydot.graph_from_dot_file(str(tmp_path / "task_graph.dot"))
    assert "&quot;ones&quot;" in (tmp_path / "task_graph.dot").read_text()


def test_kernel_records_and_labels_show_where_reductions_combine():
    """A kernel's reductions were in neither its record nor its label, so a dump did not show
    that one chunk reduces straight into the target's allocation (one device) while several
    fill scratch slots gathered afterwards."""
    def run(devices):
        q = cl.Queue(devices=devices, record=True)
        try:
            x = cl.Buffer(np.arange(8, dtype=np.int64), name="x")
            s = cl.Buffer(np.array([3], dtype=np.int64), name="s")

            def reduce(init):
                def cgf(cgh):
                    r = x.access(cgh, cl.one_to_one(), cl.read)
                    red = cl.reduction(s, cgh, cl.plus, initialize_to_identity=init)
                    cgh.parallel_for((8,), lambda c, rr: rr.combine(r[c]), reductions=(red,), name="sum")
                return cgf
            q.submit(reduce(True))
            q.submit(reduce(False))
            assert int(q.fence(s).result()[0]) == 2 * 28
            rec = q.graphs()
        finally:
            q.shutdown()
        return rec, [i for i in rec["instructions"] if i["kind"] == "device_kernel"]

    rec, kernels = run("host:1")
    first, second = ([r for r in k["reductions"]] for k in kernels)
    # (the first starts from the identity, the second from the first's result, on the device)
    assert first[0]["buffer"] == second[0]["buffer"] == 1
    assert (first[0]["include_current"], second[0]["include_current"]) == (False, True)
    assert first[0]["allocation"] == second[0]["allocation"]
    target = [i for i in rec["instructions"] if i["kind"] == "alloc" and i["buffer"] == 1 and i["memory"] == 2]
    assert [second[0]["allocation"]] == [a["allocation"] for a in target]
    dot = rec.to_dot_instructions({0: "x", 1: "s"})
    assert f"+ <i>reduce</i> R{second[0]['reduction']} B1 &quot;s&quot; into A{second[0]['allocation']} (M2 D0) " \
           f"from its value" in dot
    _rec, kernels = run("host:2")
    assert all(len(k["reductions"]) == 1 and k["reductions"][0]["include_current"] is False for k in kernels)
    assert "from the identity" in _rec.to_dot_instructions({0: "x", 1: "s"})
    assert len({k["reductions"][0]["allocation"] for k in kernels}) == 4     # (a scratch slot per chunk)
