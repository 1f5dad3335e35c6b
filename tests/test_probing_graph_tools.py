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

import celeritas as cl
from celeritas import graphs, summary, timeline
from celeritas.__main__ import main, render_folder
from celeritas.graphs import GraphRecord
from celeritas.testing import run_cluster

from test_graphs import rich_program
from test_trace import validate_chrome_trace

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
    proc = subprocess.run(["dot", "-Tsvg", str(dot_path)], capture_output=True, text=True, timeout=120)
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

XFAIL = pytest.mark.xfail(strict=True)


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
