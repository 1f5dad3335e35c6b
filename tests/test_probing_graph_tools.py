"""Adversarial probes of the tools a user debugs with: graph dumps, traces, timelines, the CLI.

A third probing round (after tests/test_api_probing.py, the core API, and
tests/test_probing_config_cli_ranks.py, configuration and ranks), aimed at
``celeritas.graphs`` (``Queue.graphs()``, ``cl.GraphRecord``, the ``CELERITAS_PRINT_GRAPHS``
dump), ``celeritas.trace`` (``CELERITAS_TRACE``), ``celeritas.timeline`` and
``python -m celeritas graphs`` / ``trace``: empty programs, programs that fail mid-run,
names full of quotes, markup, newlines, control characters and unicode, simulated 2- and
4-rank dumps whose halves must agree (push and await-push, send, pilot and receive, one
trace slice per recorded instruction), long programs, hand-damaged trace and graph files,
folders and empty files where files are expected, and ``Queue.graphs()`` called with
recording off, twice, from threads, inside a task, after a failure and after shutdown.

The project rule: every bad input gets a clear ``cl.*Error`` (on the command line: one
line and a nonzero exit status), never a traceback from deep inside, a hang, a file that
does not parse, a picture that silently shows less than the record, or lost output.

The first group are the defects found (each was a strict xfail, fixed since; its
docstring gives the input, what happened before, and what is expected).  The second
group pins probes that already behaved well and are not pinned elsewhere
(tests/test_graphs.py, test_trace.py, test_timeline.py, test_cli.py, test_summary.py).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pydot
import pytest
from test_graphs import rich_program
from test_trace import validate_chrome_trace

import celeritas as cl
from celeritas import summary, timeline
from celeritas.__main__ import main, render_folder
from celeritas.graphs import GraphRecord
from celeritas.testing import run_cluster

pytestmark = [pytest.mark.timeout(180),
              # pydot's grammar still uses pyparsing's camelCase names
              pytest.mark.filterwarnings(r"ignore:'\w+' deprecated - use:DeprecationWarning")]

HAVE_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAVE_DOT, reason="needs Graphviz's dot")

# every character a confused user (or a generated name) puts into a debug name
NASTY = 'a"b<c>&d\n\'e\\f{g}|h[i];j é ∑ \t\x01\x7f'
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    """Every probe starts from the documented defaults."""
    for var in [k for k in os.environ if k.startswith("CELERITAS_")]:
        monkeypatch.delenv(var)


# ------------------------------------------------------------------------------- helpers


def _dot(path_or_text) -> pydot.Dot:
    text = path_or_text.read_text() if isinstance(path_or_text, Path) else path_or_text
    parsed = pydot.graph_from_dot_data(text)
    assert parsed, "the DOT text parses"
    return parsed[0]


def _nodes(g) -> set[str]:
    names, stack = set(), [g]
    while stack:
        s = stack.pop()
        names.update(n.get_name().strip('"') for n in s.get_nodes())
        stack.extend(s.get_subgraphs())
    return names - {"graph", "node", "edge"}


def _edges(g) -> list:
    out, stack = [], [g]
    while stack:
        s = stack.pop()
        out.extend(s.get_edges())
        stack.extend(s.get_subgraphs())
    return out


def _render_svg(dot_path: Path) -> ET.Element:
    """Graphviz's SVG of ``dot_path``, parsed as XML (fails on a DOT file dot refuses)."""
    proc = subprocess.run(["dot", "-Tsvg", str(dot_path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and "Error" not in proc.stderr, proc.stderr
    return ET.fromstring(proc.stdout.encode())


def _cli(argv, capsys) -> tuple[int, str]:
    """``python -m celeritas ARGV`` in process: (exit status, stderr); argparse exits count too."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def _one_line_error(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _trace_file(tmp_path: Path, events: list, name="t.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"traceEvents": events}))
    return p


def _x(name="k", ts=0.0, dur=1.0, pid=1, tid=1, cat="device_kernel", **args) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _small_program(q: cl.Queue, name="inc", steps=2, fail_at=None):
    """A buffer ``b`` incremented ``steps`` times by kernel ``name``; step ``fail_at`` raises."""
    b = cl.Buffer(np.zeros(8), name="b")
    for step in range(steps):
        def cgf(cgh, step=step):
            acc = b.access(cgh, cl.one_to_one(), cl.read_write)

            @cgh.parallel_for((8,), name=name if step != fail_at else "boom")
            def kernel(chunk):
                if step == fail_at:
                    raise ValueError("boom")
                acc[chunk] = acc[chunk] + 1
        q.submit(cgf)
    return b


def _push_pairs(record: GraphRecord) -> tuple[dict, dict]:
    """(pushes, awaits): (receiving rank, transfer) -> sorted boxes pushed to / awaited on it."""
    pushes: dict = defaultdict(list)
    awaits: dict = defaultdict(list)
    for rank, cmds in record["commands"].items():
        for c in cmds:
            if c["kind"] == "push":
                for t in c["targets"]:
                    pushes[(t["rank"], tuple(c["transfer"]))].extend(t["region"])
            elif c["kind"] == "await_push":
                awaits[(rank, tuple(c["transfer"]))].extend(c["region"])
    return pushes, awaits


def _points(boxes) -> set:
    """The points of 1-D boxes (the programs here use 1-D buffers)."""
    return {x for lo, hi in boxes for x in range(lo[0], hi[0])}


@pytest.fixture(scope="module")
def cluster_dumps(tmp_path_factory):
    """rich_program on 2 and on 4 simulated ranks (2 devices each), dumped and traced."""
    out = {}
    for n in (2, 4):
        folder = tmp_path_factory.mktemp(f"ranks{n}")
        res = run_cluster(rich_program, nodes=n, devices=2, CELERITAS_PRINT_GRAPHS=str(folder / "graphs"),
                          CELERITAS_TRACE=str(folder / "trace.json"))
        expected = float((np.arange(32, dtype=np.float32) + 3).sum())
        assert [(float(r[0]), float(r[1])) for r in res] == [(expected, expected)] * n
        out[n] = folder
    return out


# =====================================================================================
# Defects found by probing (fixed): each asserts what the rule requires
# =====================================================================================


def test_control_characters_in_names_give_dot_files_graphviz_renders(tmp_path, monkeypatch):
    """Input: a buffer and a kernel named NASTY (quotes, ``<>&``, newline, tab, \\x01, \\x7f,
    unicode), CELERITAS_PRINT_GRAPHS.  Happens (before): the labels carried the raw control
    characters, which Graphviz's HTML-label parser rejects ("not well-formed (invalid
    token)"): the task, command and instruction graphs did not render at all; the newline
    vanished.  Expected: every dump parses and renders to well-formed SVG, the labels hold
    no raw control characters, and the name is still recognisable (``\\n`` shown)."""
    folder = tmp_path / "g"
    monkeypatch.setenv("CELERITAS_PRINT_GRAPHS", str(folder))
    q = cl.Queue(devices="host:2")
    b = _small_program(q, name=NASTY, steps=1)
    b.name = NASTY
    q.wait()
    q.shutdown()
    for stem in ("task_graph", "command_graph", "instruction_graph_rank0"):
        text = (folder / f"{stem}.dot").read_text()
        assert not CONTROL.search(text), stem
        assert "\\n" in text and "&amp;d" in text and "&lt;c&gt;" in text and "∑" in text, stem
        assert _nodes(_dot(text)), stem
        rec = GraphRecord.from_json((folder / f"{stem}.json").read_text())
        if stem != "command_graph":
            assert NASTY in [t["name"] for t in rec["tasks"]], "the record keeps the exact name"
        if HAVE_DOT:
            svg = _render_svg(folder / f"{stem}.dot")
            texts = "".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
            assert "é ∑" in texts


@pytest.mark.parametrize("fmt", [".svg", ".html"])
def test_control_characters_in_slice_names_give_well_formed_timelines(tmp_path, fmt):
    """Input: a trace whose kernel and buffer names hold \\x01, \\x7f, a newline, ``<>&"``;
    python -m celeritas trace -o t.svg (or .html).  Happens (before): the names went into
    the SVG escaped for HTML but with the control characters raw, so the SVG was not
    well-formed XML (xml.etree: "not well-formed (invalid token)"); browsers refuse it.
    Expected: a well-formed SVG whose bar tooltip still shows the name."""
    trace = _trace_file(tmp_path, [_x(NASTY), _x("copy B0 " + NASTY, ts=2.0, cat="copy")])
    out = tmp_path / f"t{fmt}"
    assert main(["trace", str(trace), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert not CONTROL.search(text)
    start, end = text.index("<svg"), text.index("</svg>") + len("</svg>")
    root = ET.fromstring(text[start:end])
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title") if t.text]
    assert any('a"b<c>&d' in t and "é ∑" in t for t in titles), titles


@pytest.mark.parametrize("events, words", [
    ([_x("k") | {"args": [1, 2]}], "args"),
    ([_x("k") | {"args": "text"}], "args"),
    ([{"ph": "M", "name": "process_name", "pid": 1, "args": "rank 0"}, _x("k")], "args"),
    ([_x("s", cat="send", transfer=[[1], 2, 0], to_rank=0), _x("r", cat="receive", transfer=[[1], 2, 0])],
     "transfer"),
    ([_x("k", ts=float("nan"))], "ts"),
    ([_x("k", dur=float("inf"))], "dur"),
], ids=["x-args-list", "x-args-string", "m-args-string", "transfer-of-lists", "ts-nan", "dur-infinity"])
def test_a_hand_damaged_trace_is_a_one_line_error(tmp_path, capsys, events, words):
    """Input: python -m celeritas trace on a trace whose events have ``args`` that is no
    object, a transfer id holding lists, or a NaN / Infinity time (json writes and reads
    those).  Happens (before): AttributeError, TypeError (unhashable list), ValueError or
    OverflowError tracebacks from inside timeline.parse / the time axis.  Expected: exit
    status 2 and one line naming the file and the malformed field."""
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))     # (allow_nan: writes NaN / Infinity)
    code, err = _cli(["trace", p, "-o", tmp_path / "t.svg"], capsys)
    line = _one_line_error(err)
    assert code == 2 and "t.json" in line and words in line, line
    assert not (tmp_path / "t.svg").exists()


def test_an_enormous_width_is_a_clear_error_not_a_memory_error(tmp_path, capsys):
    """Input: python -m celeritas trace t.json --width 100000000 -o t.png.  Happens (before):
    Pillow tried to allocate a 200 million pixel wide canvas: a MemoryError traceback (or the
    machine swapping).  Expected: exit status 2 and one line giving the largest width."""
    trace = _trace_file(tmp_path, [_x("k")])
    code, err = _cli(["trace", trace, "--width", "100000000", "-o", tmp_path / "t.png"], capsys)
    line = _one_line_error(err)
    assert code == 2 and "--width 100000000" in line and "at most" in line, line


def test_graphs_on_a_file_says_it_is_not_a_folder(tmp_path, capsys):
    """Input: python -m celeritas graphs task_graph.dot (a file, not the dump folder).
    Happens (before): "no such folder: task_graph.dot" although the file is right there.
    Expected: exit status 2 and a line saying it is a file, not a folder, and which folder
    to give."""
    f = tmp_path / "task_graph.dot"
    f.write_text("digraph G { a -> b; }\n")
    code, err = _cli(["graphs", f], capsys)
    line = _one_line_error(err)
    assert code == 2 and "not a folder" in line and str(tmp_path) in line, line


@needs_dot
@pytest.mark.parametrize("content", ["", "   \n"])
def test_an_empty_dot_file_is_reported_not_rendered(tmp_path, capsys, content):
    """Input: a dump folder holding an empty (or blank) task_graph.dot, e.g. from a run killed
    while writing, and python -m celeritas graphs FOLDER.  Happens (before): dot exits 0
    without writing anything and the command printed "wrote task_graph.svg" and exited 0:
    no such file exists.  Expected: exit status 1, the file named as failed (empty)."""
    (tmp_path / "task_graph.dot").write_text(content)
    code, err = _cli(["graphs", tmp_path], capsys)
    assert code == 1
    assert "failed" in err and "task_graph.dot" in err and "empty" in err, err
    assert "wrote" not in err


def test_a_failed_program_still_writes_its_graphs_and_trace(tmp_path, monkeypatch):
    """Input (one rank): CELERITAS_PRINT_GRAPHS and CELERITAS_TRACE, a kernel that works,
    then one that raises; q.wait() raises the cl.KernelError; q.shutdown().  Happens
    (before): the failure aborted the runtime, which skipped the shutdown outputs: no
    dump and no trace, exactly when the user needs them.  Expected: the dump (all three
    graphs, valid DOT and records holding the failing task) and a valid trace holding the
    kernels that ran."""
    folder, path = tmp_path / "g", tmp_path / "trace.json"
    monkeypatch.setenv("CELERITAS_PRINT_GRAPHS", str(folder))
    monkeypatch.setenv("CELERITAS_TRACE", str(path))
    q = cl.Queue(devices="host:2")
    _small_program(q, steps=2, fail_at=1)
    with pytest.raises(cl.KernelError, match="boom"):
        q.wait()
    q.shutdown()
    assert sorted(p.name for p in folder.iterdir()) == [
        "command_graph.dot", "command_graph.json", "instruction_graph_rank0.dot",
        "instruction_graph_rank0.json", "task_graph.dot", "task_graph.json"]
    rec = GraphRecord.from_json((folder / "instruction_graph_rank0.json").read_text())
    assert [t["name"] for t in rec["tasks"] if t["kind"] == "device_compute"] == ["inc", "boom"]
    assert _nodes(_dot(folder / "instruction_graph_rank0.dot")) >= {f"I{i['id']}" for i in rec["instructions"]}
    slices = validate_chrome_trace(json.loads(path.read_text()))
    assert sum(1 for x in slices[1] if x["name"] == "inc") == 2      # the first kernel, on both devices


def test_a_failed_cluster_run_leaves_every_ranks_graph_and_trace(tmp_path):
    """Input (2 simulated ranks): CELERITAS_PRINT_GRAPHS and CELERITAS_TRACE, a kernel that
    raises on rank 1 only.  Happens (before): rank 1 aborted without writing anything and
    rank 0 could not gather; the run left no instruction graph of rank 1 and no trace of
    it.  Expected: the cl.KernelError of rank 1 surfaces; both ranks' instruction graphs
    are written (valid records), and rank 1's trace is written beside rank 0's (as
    ``trace.rank1.json``, since it was not gathered), a valid trace of process rank 1."""
    folder, path = tmp_path / "g", tmp_path / "trace.json"

    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")

        def cgf(cgh):
            acc = b.access(cgh, cl.one_to_one(), cl.read_write)

            def kernel(chunk):
                if q.rank == 1:
                    raise ValueError("kernel fails on rank 1")
                acc[chunk] = acc[chunk] * 2
            cgh.parallel_for((16,), kernel, name="bad")

        q.submit(cgf)
        return q.fence(b).result(timeout=30)

    with pytest.raises(cl.KernelError, match="rank 1"):
        run_cluster(program, nodes=2, timeout=60, CELERITAS_DEVICES="host:1", CELERITAS_PRINT_GRAPHS=str(folder),
                    CELERITAS_TRACE=str(path))
    for rank in (0, 1):
        rec = GraphRecord.from_json((folder / f"instruction_graph_rank{rank}.json").read_text())
        assert list(rec["commands"]) == [rank]
        assert "bad" in [t["name"] for t in rec["tasks"]]
    docs = {0: json.loads(path.read_text()), 1: json.loads((tmp_path / "trace.rank1.json").read_text())}
    for rank, doc in docs.items():
        validate_chrome_trace(doc)
        procs = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
        assert f"rank {rank}" in procs


def test_graphs_after_a_surfaced_failure_and_after_shutdown_return_the_records():
    """Input: Queue(record=True), a kernel that raises, q.wait() raises the cl.KernelError,
    then q.graphs(); also a clean program's q.graphs() after q.shutdown().  Happens (before):
    q.graphs() raised the same KernelError again (and "the runtime has been shut down"
    after a shutdown): a program could not look at the graphs of the run that failed, nor
    at the final graphs.  Expected: the records as they stand: the failing task is in
    them; after shutdown the shutdown epoch is too."""
    q = cl.Queue(record=True, devices="host:1")
    _small_program(q, steps=2, fail_at=1)
    with pytest.raises(cl.KernelError):
        q.wait()
    rec = q.graphs()
    assert [t["name"] for t in rec["tasks"] if t["kind"] == "device_compute"] == ["inc", "boom"]
    assert Counter(i["kind"] for i in rec["instructions"])["device_kernel"] == 2
    assert q.graphs() == rec
    q.shutdown()                    # (the failure surfaced once already)

    q = cl.Queue(record=True, devices="host:1")
    _small_program(q, steps=1)
    q.shutdown()
    rec = q.graphs()
    epochs = [t for t in rec["tasks"] if t["kind"] == "epoch"]
    assert [t["action"] for t in epochs] == ["init", "shutdown"]
    assert rec["instructions"][-1]["kind"] == "epoch" and rec["instructions"][-1]["action"] == "shutdown"


def test_a_recording_started_mid_run_shows_its_dependencies_on_earlier_work():
    """Input: cl.Queue() and a kernel, then cl.Queue(record=True) (recording from now on)
    and the same kernel again; the record's task graph as DOT.  Happens (before): the
    second task depends on the first, which is not in the record; the picture dropped
    that edge without a trace: a lone task that seems to depend on nothing (the same for
    commands and instructions).  Expected: every dependency of the record is an edge; the
    unrecorded predecessor is a node marked "not recorded"."""
    q = cl.Queue(devices="host:1")
    b = cl.Buffer(np.zeros(8), name="b")

    def cgf(cgh):
        acc = b.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((8,), lambda chunk: acc.__setitem__(chunk, acc[chunk] + 1), name="inc")

    q.submit(cgf)
    q2 = cl.Queue(record=True)
    q2.submit(cgf)
    rec = q2.graphs()
    q.shutdown()
    for dot, records, node in ((rec.to_dot_tasks(), rec["tasks"], "T{}"),
                               (rec.to_dot_commands(), rec["commands"][0], "R0_C{}"),
                               (rec.to_dot_instructions(), rec["instructions"], "I{}")):
        g = _dot(dot)
        want = {(node.format(d["id"]), node.format(r["id"])) for r in records for d in r["deps"]}
        assert want, "the first recorded work depends on earlier work"
        got = {(e.get_source(), e.get_destination()) for e in _edges(g)
               if (e.get("class") or "").strip('"').startswith("dep")}
        assert got == want
        missing = {a for a, _ in want} - {node.format(r["id"]) for r in records}
        assert missing and missing <= _nodes(g)
        assert "not recorded" in dot


@pytest.mark.parametrize("text, words", [
    ("", "not JSON"),
    ("not json", "not JSON"),
    ("42", "not a celeritas graph record"),
    ('{"tasks": 1, "commands": {}, "instructions": [], "pilots": []}', "tasks"),
    ('{"tasks": [], "commands": {"x": []}, "instructions": [], "pilots": []}', "commands"),
    ('{"tasks": [1], "commands": {}, "instructions": [], "pilots": []}', "tasks"),
    ('{"tasks": [], "commands": {}, "instructions": [{"kind": "alloc"}], "pilots": []}', "instructions"),
])
def test_a_malformed_graph_record_is_a_celeritas_error(text, words):
    """Input: cl.GraphRecord.from_json on an empty text, no JSON, a number, or a record whose
    lists are no lists, whose rank keys are no integers, or whose entries lack ``id``.
    Happens (before): json.JSONDecodeError, TypeError ("'int' object is not iterable") or
    int()'s ValueError, or (for a list of numbers) a record that later broke every to_dot_*
    with TypeError.  Expected: a cl.CeleritasError (still a ValueError, as before) saying what
    is wrong with the record."""
    with pytest.raises(cl.CeleritasError, match=words) as info:
        GraphRecord.from_json(text)
    assert isinstance(info.value, ValueError)


def test_merging_two_records_of_one_rank_is_an_error():
    """Input: cl.GraphRecord.merge of two records that both hold commands of rank 0 (e.g.
    two runs' instruction_graph_rank0.json).  Happens (before): the second silently
    replaced the first: commands lost from the merged picture.  Expected: a
    cl.CeleritasError naming the rank."""
    a = GraphRecord(commands={0: [{"id": 0, "kind": "epoch", "task": 0, "deps": []}]})
    b = GraphRecord(commands={0: [{"id": 1, "kind": "epoch", "task": 0, "deps": []}]})
    with pytest.raises(cl.CeleritasError, match="rank 0"):
        GraphRecord.merge([a, b])
    c = GraphRecord(commands={1: [{"id": 0, "kind": "epoch", "task": 0, "deps": []}]})
    assert sorted(GraphRecord.merge([a, c])["commands"]) == [0, 1]


def test_a_dump_folder_reused_by_a_smaller_run_holds_no_stale_graphs(tmp_path):
    """Input: CELERITAS_PRINT_GRAPHS=DIR for a 4-rank run rendered with python -m celeritas
    graphs DIR, then the same DIR for a 2-rank run.  Happens (before): DIR still held
    instruction_graph_rank2/3 (.dot, .json, .svg) and the SVGs of the first run beside the
    new .dot files: the folder mixed two runs and the pictures showed the old one.
    Expected: after the second run DIR holds exactly its own files."""
    folder = tmp_path / "g"

    def program(rank):
        q = cl.Queue()
        _small_program(q, steps=1)
        q.wait()

    run_cluster(program, nodes=4, CELERITAS_DEVICES="host:1", CELERITAS_PRINT_GRAPHS=str(folder))
    for f in folder.glob("*.dot"):            # what python -m celeritas graphs would add
        f.with_suffix(".svg").write_text("<svg/>")
    run_cluster(program, nodes=2, CELERITAS_DEVICES="host:1", CELERITAS_PRINT_GRAPHS=str(folder))
    assert sorted(p.name for p in folder.iterdir()) == [
        "command_graph.dot", "command_graph.json", "instruction_graph_rank0.dot", "instruction_graph_rank0.json",
        "instruction_graph_rank1.dot", "instruction_graph_rank1.json", "task_graph.dot", "task_graph.json"]


# =====================================================================================
# Probes that already behave well (pinned)
# =====================================================================================


def test_the_dump_of_an_empty_program_is_two_epochs(tmp_path, monkeypatch):
    """Input: cl.Queue() and q.shutdown() with nothing submitted, dumped and traced.
    Expected: all three graphs, each valid DOT: tasks init -> shutdown (one execution-front
    edge), one epoch command and one epoch instruction each; a valid trace of two epochs."""
    folder, path = tmp_path / "g", tmp_path / "t.json"
    monkeypatch.setenv("CELERITAS_PRINT_GRAPHS", str(folder))
    monkeypatch.setenv("CELERITAS_TRACE", str(path))
    cl.Queue().shutdown()
    trec = GraphRecord.from_json((folder / "task_graph.json").read_text())
    assert [(t["kind"], t["action"]) for t in trec["tasks"]] == [("epoch", "init"), ("epoch", "shutdown")]
    g = _dot(folder / "task_graph.dot")
    assert _nodes(g) == {"T0", "T1"}
    assert [(e.get_source(), e.get_destination(), e.get("class").strip('"')) for e in _edges(g)] == \
        [("T0", "T1", "dep true execution_front")]
    crec = GraphRecord.from_json((folder / "command_graph.json").read_text())
    assert [c["kind"] for c in crec["commands"][0]] == ["epoch", "epoch"]
    irec = GraphRecord.from_json((folder / "instruction_graph_rank0.json").read_text())
    assert [i["kind"] for i in irec["instructions"]] == ["epoch", "epoch"] and irec["pilots"] == []
    assert _nodes(_dot(folder / "instruction_graph_rank0.dot")) == {"I0", "I1"}
    slices = validate_chrome_trace(json.loads(path.read_text()))
    assert [x["cat"] for x in slices[1]] == ["epoch", "epoch"]


def test_markup_in_names_is_escaped_and_the_records_keep_the_name(tmp_path, monkeypatch):
    """Input: buffer and kernel names holding ``<b>``, ``&amp;``, both quotes and unicode.
    Expected: DOT labels escape them (no markup injected into Graphviz's HTML labels) and
    pydot parses every file; the JSON records hold the names exactly."""
    name = '<b>bold</b> &amp; "q" \'s\' ∂x'
    folder = tmp_path / "g"
    monkeypatch.setenv("CELERITAS_PRINT_GRAPHS", str(folder))
    q = cl.Queue(devices="host:2")
    b = _small_program(q, name=name, steps=1)
    b.name = name
    q.shutdown()
    escaped = "&lt;b&gt;bold&lt;/b&gt; &amp;amp; &quot;q&quot; &#x27;s&#x27; ∂x"
    for stem in ("task_graph", "command_graph", "instruction_graph_rank0"):
        text = (folder / f"{stem}.dot").read_text()
        assert escaped in text and "<b>bold</b>" not in text, stem
        _dot(text)
    rec = GraphRecord.from_json((folder / "task_graph.json").read_text())
    assert name in [t["name"] for t in rec["tasks"]]


@needs_dot
def test_every_dump_of_a_two_rank_run_renders_to_well_formed_svg(cluster_dumps, capsys, tmp_path):
    """Input: python -m celeritas graphs on a 2-rank dump (every command and most instruction
    kinds).  Expected: exit 0, one ``wrote`` line per .dot, every SVG well-formed XML with
    one ``node`` group per node of the DOT file."""
    folder = tmp_path / "g"
    shutil.copytree(cluster_dumps[2] / "graphs", folder)
    code, err = _cli(["graphs", folder], capsys)
    assert code == 0 and err.count("wrote") == 4, err
    for dot in folder.glob("*.dot"):
        root = ET.parse(dot.with_suffix(".svg")).getroot()
        groups = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if "node" in (g.get("class") or "").split()]
        assert len(groups) == len(_nodes(_dot(dot))), dot.name


@pytest.mark.parametrize("n", [2, 4])
def test_the_dump_has_one_instruction_graph_per_rank_and_every_rank_in_the_command_graph(cluster_dumps, n):
    """Input: rich_program on n simulated ranks with CELERITAS_PRINT_GRAPHS.  Expected: task
    and command graph once, instruction_graph_rank{R} for R < n, the command graph holding
    the commands of all n ranks with rank labels R0..R{n-1}, each rank's record only its own."""
    folder = cluster_dumps[n] / "graphs"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["task_graph.dot", "task_graph.json", "command_graph.dot", "command_graph.json"]
        + [f"instruction_graph_rank{r}.{ext}" for r in range(n) for ext in ("dot", "json")])
    crec = GraphRecord.from_json((folder / "command_graph.json").read_text())
    assert sorted(crec["commands"]) == list(range(n))
    text = (folder / "command_graph.dot").read_text()
    assert f"Command graph ({n} ranks)" in text
    for r in range(n):
        assert f">R{r}</font>" in text
        irec = GraphRecord.from_json((folder / f"instruction_graph_rank{r}.json").read_text())
        assert list(irec["commands"]) == [r]
        assert irec["commands"][r] == crec["commands"][r], "the merged picture holds exactly each rank's commands"


@pytest.mark.parametrize("n", [2, 4])
def test_every_push_has_its_await_push_on_the_target_rank(cluster_dumps, n):
    """Input: the n-rank command graph record.  Expected: for each (receiving rank,
    transfer) the boxes pushed to it equal the boxes it awaits, point for point, and a push
    never targets its own rank."""
    crec = GraphRecord.from_json((cluster_dumps[n] / "graphs" / "command_graph.json").read_text())
    pushes, awaits = _push_pairs(crec)
    assert pushes and set(pushes) == set(awaits)
    for key in pushes:
        assert _points(pushes[key]) == _points(awaits[key]), key
    for rank, cmds in crec["commands"].items():
        assert all(t["rank"] != rank for c in cmds if c["kind"] == "push" for t in c["targets"])


@pytest.mark.parametrize("n", [2, 4])
def test_the_command_graph_joins_each_push_target_to_its_await_push(cluster_dumps, n):
    """Input: the n-rank command_graph.dot.  Expected: one dashed ``transfer`` edge per push
    target, from R{src}_C{push} to R{dst}_C{await push of the same transfer}, always between
    different ranks; every other edge is a dependency within one rank."""
    folder = cluster_dumps[n] / "graphs"
    crec = GraphRecord.from_json((folder / "command_graph.json").read_text())
    awaits = {(r, tuple(c["transfer"])): c["id"] for r, cs in crec["commands"].items() for c in cs
              if c["kind"] == "await_push"}
    want = Counter((f"R{r}_C{c['id']}", f"R{t['rank']}_C{awaits[(t['rank'], tuple(c['transfer']))]}")
                   for r, cs in crec["commands"].items() for c in cs if c["kind"] == "push" for t in c["targets"])
    edges = _edges(_dot(folder / "command_graph.dot"))
    got = Counter((e.get_source(), e.get_destination()) for e in edges if e.get("class").strip('"') == "transfer")
    assert got == want
    for e in edges:
        if e.get("class").strip('"').startswith("dep"):
            assert e.get_source().split("_")[0] == e.get_destination().split("_")[0]


@pytest.mark.parametrize("n", [2, 4])
def test_every_send_has_its_pilot_and_a_receive_on_the_target_rank(cluster_dumps, n):
    """Input: the n ranks' instruction graph records.  Expected: each send has the pilot of
    its message id (same target, transfer and box), and the target rank receives that
    transfer (receive, split_receive or gather_receive) over a region covering the send's
    box."""
    folder = cluster_dumps[n] / "graphs"
    recs = {r: GraphRecord.from_json((folder / f"instruction_graph_rank{r}.json").read_text()) for r in range(n)}
    total = 0
    for rec in recs.values():
        pilots = {p["msg_id"]: p for p in rec["pilots"]}
        sends = [i for i in rec["instructions"] if i["kind"] == "send"]
        total += len(sends)
        for s_ in sends:
            p = pilots[s_["msg_id"]]
            assert (p["to"], p["transfer"], p["box"]) == (s_["to"], s_["transfer"], s_["box"])
            receiving = [i for i in recs[s_["to"]]["instructions"]
                         if i["kind"] in ("receive", "split_receive", "gather_receive")
                         and i["transfer"] == s_["transfer"]]
            assert receiving, s_
            if receiving[0]["kind"] != "gather_receive":
                assert _points([s_["box"]]) <= _points(b for i in receiving for b in i["region"])
    assert total > 0


@pytest.mark.parametrize("n", [2, 4])
def test_the_trace_has_every_rank_and_one_slice_per_recorded_instruction(cluster_dumps, n):
    """Input: the n-rank CELERITAS_TRACE file beside the dump.  Expected: a valid Chrome
    trace (every flow starts and finishes, no overlapping slices on a track, the format's
    fields typed), processes ``rank 0`` .. ``rank n-1``, and on each rank exactly one slice
    per instruction of its instruction graph (same ids, same kinds): the dump agrees with
    what ran."""
    doc = json.loads((cluster_dumps[n] / "trace.json").read_text())
    slices = validate_chrome_trace(doc)
    assert sorted(slices) == list(range(1, n + 1))
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {r + 1: f"rank {r}" for r in range(n)}
    assert doc["otherData"]["ranks"] == n
    for r in range(n):
        rec = GraphRecord.from_json((cluster_dumps[n] / "graphs" / f"instruction_graph_rank{r}.json").read_text())
        xs = slices[r + 1]
        assert sorted(x["args"]["instruction"] for x in xs) == sorted(i["id"] for i in rec["instructions"])
        assert Counter(x["cat"] for x in xs) == Counter(i["kind"] for i in rec["instructions"])


@pytest.mark.parametrize("n", [2, 4])
def test_trace_dependencies_and_transfer_arrows_follow_the_records(cluster_dumps, n):
    """Input: the n-rank trace and dump.  Expected: each slice's ``deps`` are its
    instruction's recorded dependencies; every ``transfer`` arrow starts at a send of rank
    r and ends on a slice of the rank that send targets; every send whose transfer the
    target receives has one arrow."""
    doc = json.loads((cluster_dumps[n] / "trace.json").read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    for r in range(n):
        rec = GraphRecord.from_json((cluster_dumps[n] / "graphs" / f"instruction_graph_rank{r}.json").read_text())
        deps = {i["id"]: sorted(d["id"] for d in i["deps"]) for i in rec["instructions"]}
        for x in (x for x in xs if x["pid"] == r + 1):
            assert sorted(x["args"].get("deps", [])) == deps[x["args"]["instruction"]]
    by_pos = {(x["pid"], x["tid"], x["ts"]): x for x in xs}
    starts = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "s" and e["cat"] == "transfer"}
    ends = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f" and e["cat"] == "transfer"}
    assert set(starts) == set(ends) and starts
    for fid, s_ in starts.items():
        send = by_pos[(s_["pid"], s_["tid"], s_["ts"])]
        assert send["cat"] == "send" and ends[fid]["pid"] == send["args"]["to_rank"] + 1
    sends = [x for x in xs if x["cat"] == "send"]
    assert len(starts) == len(sends)


def test_kernel_instructions_in_the_record_are_the_kernels_that_ran():
    """Input: Queue(record=True) on host:2, 40 stencil steps (replay on: most lowerings
    come from templates); each kernel call counted per device.  Expected: the record's
    device_kernel instructions per device equal the calls per device; task ids are
    0..n-1, instruction ids unique, and every dependency names a recorded instruction."""
    q = cl.Queue(record=True, devices="host:2")
    a, b = cl.Buffer(np.zeros(64), name="a"), cl.Buffer(np.zeros(64), name="b")
    calls, lock = Counter(), threading.Lock()
    for step in range(40):
        src, dst = (a, b) if step % 2 == 0 else (b, a)

        def cgf(cgh, src=src, dst=dst):
            r = src.access(cgh, cl.neighborhood(1), cl.read)
            w = dst.access(cgh, cl.one_to_one(), cl.discard_write)

            @cgh.parallel_for((64,), name="stencil")
            def kernel(chunk):
                with lock:
                    calls[chunk.device] += 1
                w[chunk] = r[chunk] + 1
        q.submit(cgf)
    assert q.fence(a).result()[0] == 40
    rec = q.graphs()
    q.shutdown()
    kernels = [i for i in rec["instructions"] if i["kind"] == "device_kernel"]
    assert Counter(i["device"] for i in kernels) == calls == Counter({0: 40, 1: 40})
    assert [t["id"] for t in rec["tasks"]] == list(range(len(rec["tasks"])))
    ids = [i["id"] for i in rec["instructions"]]
    assert len(ids) == len(set(ids))
    assert all(d["id"] in set(ids) for i in rec["instructions"] for d in i["deps"])


def test_replay_on_and_off_record_identical_graphs():
    """Input: the same 30-step program with CELERITAS_REPLAY=on and =off, Queue(record=True).
    Expected: byte-identical JSON records (docs/api.md: graphs are identical either way)."""
    def run(replay):
        records = run_cluster(lambda rank: _replay_program(), nodes=1, CELERITAS_REPLAY=replay,
                              CELERITAS_DEVICES="host:2")
        return records[0]
    assert run("on") == run("off")


def _replay_program() -> str:
    q = cl.Queue(record=True)
    b = _small_program(q, steps=30)
    assert q.fence(b).result().sum() == 240
    text = q.graphs().to_json()
    q.shutdown()
    return text


def test_the_dump_holds_what_queue_graphs_returned_before_shutdown(tmp_path, monkeypatch):
    """Input: Queue(record=True) with CELERITAS_PRINT_GRAPHS; q.graphs() after 3 kernels,
    then shutdown.  Expected: the dump's record starts with exactly the records q.graphs()
    returned (same tasks, instructions, dependencies) and adds only the shutdown's work."""
    folder = tmp_path / "g"
    monkeypatch.setenv("CELERITAS_PRINT_GRAPHS", str(folder))
    q = cl.Queue(record=True, devices="host:2")
    _small_program(q, steps=3)
    q.wait()
    live = q.graphs()
    q.shutdown()
    dumped = GraphRecord.from_json((folder / "instruction_graph_rank0.json").read_text())
    for key in ("tasks", "instructions"):
        assert dumped[key][:len(live[key])] == live[key]
    assert dumped["commands"][0][:len(live["commands"][0])] == live["commands"][0]
    assert [t["kind"] for t in dumped["tasks"][len(live["tasks"]):]] == ["epoch"]


def test_graphs_with_recording_off_says_how_to_turn_it_on():
    """Input: cl.Queue() (no record, no CELERITAS_RECORD, no dump) and q.graphs().
    Expected: cl.CeleritasError naming record=True and CELERITAS_RECORD=1."""
    q = cl.Queue(devices="host:1")
    with pytest.raises(cl.CeleritasError, match=r"record=True.*CELERITAS_RECORD=1"):
        q.graphs()
    q.shutdown()


def test_graphs_twice_gives_equal_independent_copies():
    """Input: q.graphs() twice, then the first result mutated.  Expected: equal records, the
    second unaffected by the mutation, and a third call unaffected too."""
    q = cl.Queue(record=True, devices="host:1")
    _small_program(q, steps=2)
    first, second = q.graphs(), q.graphs()
    assert first == second and first is not second
    first["tasks"][0]["name"] = "mutated"
    first["instructions"].clear()
    assert second["tasks"][0]["name"] == "init" and q.graphs()["tasks"][0]["name"] == "init"
    assert q.graphs()["instructions"]
    q.shutdown()


def test_graphs_from_several_threads_while_they_submit_is_consistent():
    """Input: three threads, each submitting 15 kernels and calling q.graphs() after each.
    Expected: no error or hang; every snapshot is a consistent record (task ids
    contiguous, every dependency inside the snapshot), and the final one has all 45."""
    q = cl.Queue(record=True, devices="host:1")
    b = cl.Buffer(np.zeros(4), name="b")
    problems, snaps = [], []

    def cgf(cgh):
        b.access(cgh, cl.all(), cl.read_write)
        cgh.parallel_for((4,), lambda chunk: None, name="k")

    def worker():
        try:
            for _ in range(15):
                q.submit(cgf)
                snaps.append(q.graphs())
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            problems.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not problems and len(snaps) == 45
    for rec in snaps:
        ids = [t["id"] for t in rec["tasks"]]
        assert ids == list(range(len(ids)))
        assert all(d["id"] in set(ids) for t in rec["tasks"] for d in t["deps"])
    final = q.graphs()
    assert sum(1 for t in final["tasks"] if t["name"] == "k") == 45
    q.shutdown()


def test_graphs_inside_a_host_task_returns_without_hanging():
    """Input: q.graphs() called from inside a master-node host task.  Expected: it returns
    (no deadlock between the executor running the task and the scheduler sync) a record
    that already holds the host task."""
    q = cl.Queue(record=True, devices="host:1")
    seen = []

    def cgf(cgh):
        cgh.host_task(lambda part: seen.append([t["name"] for t in q.graphs()["tasks"]]), on=cl.on_master_node,
                      name="look")
    q.submit(cgf)
    q.wait()
    q.shutdown()
    assert len(seen) == 1 and "look" in seen[0]


def test_a_record_round_trips_through_json_with_integer_rank_keys(cluster_dumps):
    """Input: every .json of the 4-rank dump read with from_json and written with to_json.
    Expected: the same text, rank keys strings in JSON and ints in Python, and the same DOT."""
    for path in (cluster_dumps[4] / "graphs").glob("*.json"):
        rec = GraphRecord.from_json(path.read_text())
        assert all(isinstance(k, int) for k in rec["commands"])
        assert json.loads(rec.to_json()) == json.loads(path.read_text())
        again = GraphRecord.from_json(rec.to_json())
        assert again == rec and again.to_dot_instructions() == rec.to_dot_instructions()


def test_dot_without_buffer_names_labels_buffers_by_id():
    """Input: to_dot_tasks / _commands / _instructions of a record with no names passed.
    Expected: buffers are labelled ``B0`` with no quoted name, and every file parses."""
    q = cl.Queue(record=True, devices="host:1")
    _small_program(q, steps=1)
    rec = q.graphs()
    q.shutdown()
    for dot in (rec.to_dot_tasks(), rec.to_dot_commands(), rec.to_dot_instructions()):
        assert "B0" in dot and 'B0 &quot;' not in dot
        _dot(dot)


def test_a_long_program_is_dumped_whole(tmp_path, monkeypatch):
    """Input: 300 kernels with CELERITAS_PRINT_GRAPHS.  Expected: no truncation: 300
    device-compute tasks in the record and 300 task nodes (plus horizons and epochs) in the
    DOT, one edge per recorded dependency."""
    folder = tmp_path / "g"
    monkeypatch.setenv("CELERITAS_PRINT_GRAPHS", str(folder))
    q = cl.Queue(devices="host:1")
    _small_program(q, steps=300)
    q.shutdown()
    rec = GraphRecord.from_json((folder / "task_graph.json").read_text())
    assert sum(1 for t in rec["tasks"] if t["kind"] == "device_compute") == 300
    g = _dot(folder / "task_graph.dot")
    assert _nodes(g) == {f"T{t['id']}" for t in rec["tasks"]}
    assert len(_edges(g)) == sum(len(t["deps"]) for t in rec["tasks"])


def test_the_timeline_of_a_long_trace_counts_every_instruction_once(tmp_path, monkeypatch):
    """Input: a trace of 200 kernels on host:2, drawn 800 pixels wide as SVG.  Expected:
    bars are merged (fewer bars than instructions), yet their counts add up to every
    instruction of the trace, per kind."""
    path = tmp_path / "t.json"
    monkeypatch.setenv("CELERITAS_TRACE", str(path))
    q = cl.Queue(devices="host:2")
    _small_program(q, steps=200)
    q.shutdown()
    doc = json.loads(path.read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    out = tmp_path / "t.svg"
    timeline.render(path, out, width=800)
    bars = [r for r in ET.parse(out).getroot().iter("{http://www.w3.org/2000/svg}rect") if r.get("class") == "bar"]
    assert len(bars) < len(xs)
    per_kind = Counter()
    for r in bars:
        per_kind[r.get("data-kind")] += int(r.get("data-count"))
    assert per_kind == Counter(x["cat"] for x in xs)
    assert per_kind["device_kernel"] == 400


@pytest.mark.parametrize("n", [2, 4])
def test_the_timeline_of_a_cluster_trace_has_every_rank_and_transfer(cluster_dumps, tmp_path, n):
    """Input: python -m celeritas trace on the n-rank trace, -o t.html.  Expected: exit 0, a
    well-formed SVG inside with a band per rank, and one transfer line per matched send
    (merged lines' counts add up); the tables list every rank."""
    out = tmp_path / "t.html"
    assert main(["trace", str(cluster_dumps[n] / "trace.json"), "-o", str(out)]) == 0
    text = out.read_text()
    root = ET.fromstring(text[text.index("<svg"):text.index("</svg>") + len("</svg>")])
    ranks = {int(t.get("data-rank")) for t in root.iter("{http://www.w3.org/2000/svg}text")
             if t.get("class") == "rank-label"}
    assert ranks == set(range(n))
    tl = timeline.load(cluster_dumps[n] / "trace.json")
    lines = [ln for ln in root.iter("{http://www.w3.org/2000/svg}line") if ln.get("class") == "transfer"]
    assert sum(int(ln.get("data-count")) for ln in lines) == len(tl.transfers) > 0
    assert tl.unmatched_sends == 0
    for r in range(n):
        assert f"<td>R{r}</td>" in text


def _wrong_trace_input(kind: str, d: Path) -> Path:
    """A path for ``python -m celeritas trace`` that is not a usable trace, of the ``kind`` asked."""
    if kind == "missing":
        return d / "missing.json"
    if kind == "directory":
        (d / "dir.json").mkdir()
        return d / "dir.json"
    path = d / ("z.json.gz" if kind == "broken-gzip" else "t.json")
    content = {"empty": b"", "binary": b"\xff\xfe\x00garbage", "graph-record": GraphRecord().to_json().encode(),
               "no-slices": b'{"traceEvents": []}', "broken-gzip": b"\x1f\x8b\x08garbage"}[kind]
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("kind, words", [
    ("missing", "no such file"), ("directory", "is not a file"), ("empty", "not JSON"), ("binary", "not JSON"),
    ("graph-record", "no traceEvents"), ("no-slices", "no executed instructions"), ("broken-gzip", "z.json.gz"),
])
def test_trace_cli_on_the_wrong_input_is_one_line_and_exit_2(tmp_path, capsys, kind, words):
    """Input: python -m celeritas trace on a missing file, a folder, an empty file, binary
    junk, a graph record (the wrong JSON), a trace without slices, a broken gzip.
    Expected: exit status 2, one line naming the problem, no output file."""
    code, err = _cli(["trace", _wrong_trace_input(kind, tmp_path), "-o", tmp_path / "out.svg"], capsys)
    line = _one_line_error(err)
    assert code == 2 and words in line, line
    assert not (tmp_path / "out.svg").exists()


@pytest.mark.parametrize("output, words", [
    ("out.txt", "must end in .png, .svg or .html"),
    ("out", "must end in .png, .svg or .html"),
    ("folder.svg", "Is a directory"),
])
def test_trace_cli_with_an_unusable_output_is_one_line_and_exit_2(tmp_path, capsys, output, words):
    """Input: python -m celeritas trace with -o of another extension, of none, or naming a
    folder.  Expected: exit status 2, one line naming the output."""
    (tmp_path / "folder.svg").mkdir()
    trace = _trace_file(tmp_path, [_x("k")])
    code, err = _cli(["trace", trace, "-o", tmp_path / output], capsys)
    line = _one_line_error(err)
    assert code == 2 and words in line, line


@pytest.mark.parametrize("argv", [[], ["bogus"], ["graphs"], ["trace"], ["trace", "t.json", "--width", "wide"]],
                         ids=["nothing", "unknown-command", "graphs-no-dir", "trace-no-file", "width-not-int"])
def test_cli_usage_errors_exit_2_without_a_traceback(capsys, argv):
    """Input: python -m celeritas with no command, an unknown one, or a subcommand missing its
    argument or given a non-integer width.  Expected: argparse's usage and exit status 2."""
    code, err = _cli(argv, capsys)
    assert code == 2 and "usage:" in err and "Traceback" not in err


def test_graphs_cli_on_a_broken_dot_file_names_it_and_renders_the_rest(tmp_path, capsys):
    """Input: python -m celeritas graphs on a folder with one valid and one truncated .dot.
    Expected: exit 1, the valid one rendered, the broken one named as failed with dot's
    message."""
    if not HAVE_DOT:
        pytest.skip("needs Graphviz's dot")
    (tmp_path / "good.dot").write_text("digraph G { a -> b; }\n")
    (tmp_path / "bad.dot").write_text("digraph G { a -> ")
    code, err = _cli(["graphs", tmp_path], capsys)
    assert code == 1
    assert "wrote" in err and "good.svg" in err and "failed" in err and "bad.dot" in err and "syntax error" in err
    ET.parse(tmp_path / "good.svg")


def test_graphs_cli_on_an_empty_folder_or_a_missing_one(tmp_path, capsys):
    """Input: python -m celeritas graphs on a folder without .dot files, and on a missing one.
    Expected: exit 1 saying there are none (and how to write them), exit 2 'no such folder'."""
    assert render_folder(tmp_path) == 1
    assert "no .dot files" in capsys.readouterr().err
    code, err = _cli(["graphs", tmp_path / "nope"], capsys)
    assert code == 2 and "no such folder" in err


def test_a_graph_folder_that_is_a_file_is_a_config_error_at_start(tmp_path, monkeypatch):
    """Input: CELERITAS_PRINT_GRAPHS naming an existing plain file.  Expected: cl.ConfigError
    naming the variable when the Queue is made, not a lost dump at shutdown."""
    f = tmp_path / "afile"
    f.write_text("x")
    monkeypatch.setenv("CELERITAS_PRINT_GRAPHS", str(f))
    with pytest.raises(cl.ConfigError, match="CELERITAS_PRINT_GRAPHS"):
        cl.Queue()


def test_summary_numbers_agree_with_the_records_on_every_rank():
    """Input (2 simulated ranks, CELERITAS_RECORD=1): rich_program's kind of work, and
    summary.rank_numbers on each rank before shutdown.  Expected: the summary's
    instructions by kind equal the counts in that rank's own record."""
    def program(rank):
        q = cl.Queue()
        b = _small_program(q, steps=3)
        q.fence(b).result()
        q.wait()
        numbers = summary.rank_numbers(q.runtime.outputs())
        rec = q.graphs()
        q.shutdown()
        return numbers, dict(Counter(i["kind"] for i in rec["instructions"]))

    for numbers, counts in run_cluster(program, nodes=2, CELERITAS_DEVICES="host:2", CELERITAS_RECORD="1"):
        assert {k: v for k, v in numbers["instructions_by_kind"].items() if v} == counts


def test_the_summary_of_an_empty_program(monkeypatch, capfd):
    """Input: CELERITAS_SUMMARY=1, cl.Queue(), shutdown.  Expected: the summary says 2
    tasks and 2 epoch instructions, no bytes moved, and prints no traceback."""
    monkeypatch.setenv("CELERITAS_SUMMARY", "1")
    cl.Queue().shutdown()
    captured = capfd.readouterr()
    out = " ".join((captured.out + captured.err).split())
    assert "celeritas summary (1 rank)" in out
    assert re.search(r"tasks │ 2 │", out) and re.search(r"epoch │ 2 │", out)
    assert "bytes sent │ 0 bytes" in out and "Traceback" not in out
