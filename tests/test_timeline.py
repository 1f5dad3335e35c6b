"""``python -m celeritas trace``: the execution timeline drawn from a real multi-rank trace.

The expected rows and transfers are computed from the trace JSON directly (not through
``celeritas.timeline``), so the picture is checked against what the trace records.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from jobs import run_job

import celeritas as cl
from celeritas import timeline
from celeritas.__main__ import main
from celeritas.testing import run_cluster

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = Path(sys.executable).with_name("mpiexec")
SVG = "{http://www.w3.org/2000/svg}"

PROGRAM = """
import numpy as np
import celeritas as cl

q = cl.Queue()
n = 4096
a = cl.Buffer(np.arange(n, dtype=np.float32), name="a")
b = cl.Buffer(shape=(n,), dtype=np.float32, name="b")
for step in range(4):
    def smooth(cgh):
        r = a.access(cgh, cl.neighborhood(1), cl.read)
        w = b.access(cgh, cl.one_to_one(), cl.discard_write)

        @cgh.parallel_for((n,), name="smooth")
        def kernel(chunk):
            lo, hi = chunk.box.lo[0], chunk.box.hi[0]
            w[lo:hi] = r[max(lo - 1, 0):max(lo - 1, 0) + (hi - lo)]

    def total(cgh):
        r = b.access(cgh, cl.all(), cl.read)
        w = a.access(cgh, cl.one_to_one(), cl.discard_write)

        @cgh.parallel_for((n,), name="total")
        def kernel(chunk):
            w[chunk] = r[...].sum() / n + chunk.arange(0)

    q.submit(smooth)
    q.submit(total)
result = q.fence(a).result()
if q.rank == 0:
    print("checksum", float(result.sum()))
"""


def _expected_rows(doc: dict) -> set[tuple[int, str]]:
    """(rank, lane) of every track that holds an instruction, extra rows ``#N`` folded."""
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "X"}
    return {(int(re.match(r"rank (\d+)", procs[pid]).group(1)), re.sub(r" #\d+$", "", threads[(pid, tid)]))
            for pid, tid in used}


def _expected_transfers(doc: dict) -> set[tuple[int, int]]:
    """(from rank, to rank) of every send whose transfer is received on its target rank."""
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    received = {(e["pid"] - 1, tuple(e["args"]["transfer"])) for e in xs
                if e["cat"] in timeline.RECEIVE_KINDS and "transfer" in e["args"]}
    return {(e["pid"] - 1, e["args"]["to_rank"]) for e in xs
            if e["cat"] == "send" and (e["args"]["to_rank"], tuple(e["args"]["transfer"])) in received}


def _svg_root(text: str) -> ET.Element:
    start = text.index("<svg")
    end = text.index("</svg>") + len("</svg>")
    return ET.fromstring(text[start:end])


def _check_svg(root: ET.Element, doc: dict) -> None:
    labels = [t for t in root.iter(f"{SVG}text") if t.get("class") == "row-label"]
    got = [(int(t.get("data-rank")), t.get("data-lane")) for t in labels]
    assert len(got) == len(set(got)), "one row label per rank and lane"
    assert set(got) == _expected_rows(doc)
    for t in labels:
        assert re.search(r" \u00b7 \d+ % busy$", t.text), t.text
    # every instruction of the trace is in exactly one bar
    bars = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"]
    assert sum(int(r.get("data-count")) for r in bars) == sum(1 for e in doc["traceEvents"] if e["ph"] == "X")
    lines = {(int(ln.get("data-from-rank")), int(ln.get("data-to-rank")))
             for ln in root.iter(f"{SVG}line") if ln.get("class") == "transfer"}
    assert lines == _expected_transfers(doc)
    assert any(a != b for a, b in lines), "transfers between ranks are drawn"


def _check_png(path: Path) -> None:
    from PIL import Image
    with Image.open(path) as img:
        assert img.format == "PNG"
        img.load()
        rgb = img.convert("RGB")
    w, h = rgb.size
    assert w == 1600 and 200 <= h <= 2000
    colours = rgb.getcolors(maxcolors=1 << 20)
    assert len(colours) > 50
    # kernels and sends are there in their legend colours (the legend swatches at least)
    px = np.asarray(rgb).reshape(-1, 3).astype(int)
    for kind in ("device_kernel", "send", "receive"):
        c = np.array([int(timeline.KIND_COLOURS[kind][i:i + 2], 16) for i in (1, 3, 5)])
        assert (np.abs(px - c).sum(axis=1) <= 6).sum() >= 50, kind
    # not blank: plenty of non-white pixels
    assert (px.sum(axis=1) < 700).mean() > 0.05


@pytest.fixture(scope="module")
def mpi_trace(tmp_path_factory) -> Path:
    if not MPIEXEC.exists():
        pytest.skip(f"needs {MPIEXEC} (pip install 'celeritas[mpi]')")
    tmp = tmp_path_factory.mktemp("timeline")
    script = tmp / "program.py"
    script.write_text(PROGRAM)
    trace = tmp / "trace.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERITAS_")}
    env.update(CELERITAS_DEVICES="host:2", CELERITAS_TRACE=str(trace), PYTHONPATH=str(ROOT))
    r = run_job([MPIEXEC, "-n", "2", sys.executable, script], env, 180, cwd=tmp)
    out = r.stdout
    assert r.returncode == 0, r.stdout + r.stderr
    assert out.count("checksum") == 1
    return trace


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_png_svg_html_of_a_two_rank_mpi_trace(mpi_trace, tmp_path, capsys):
    doc = json.loads(mpi_trace.read_text())
    assert doc["otherData"]["ranks"] == 2
    for ext in ("png", "svg", "html"):
        out = tmp_path / f"timeline.{ext}"
        assert main(["trace", str(mpi_trace), "-o", str(out)]) == 0
        assert f"wrote {out}" in capsys.readouterr().err
    _check_png(tmp_path / "timeline.png")
    _check_svg(ET.parse(tmp_path / "timeline.svg").getroot(), doc)
    page = (tmp_path / "timeline.html").read_text()
    _check_svg(_svg_root(page), doc)
    # self-contained: nothing fetched from elsewhere
    assert "<script" not in page and "<link" not in page and "src=" not in page
    assert page.count("<tr><td>R") == len(_expected_rows(doc))


@pytest.mark.timeout(120)
def test_run_cluster_trace_has_both_ranks(tmp_path):
    trace = tmp_path / "trace.json"

    def program(rank):
        q = cl.Queue()
        a = cl.Buffer(np.arange(256, dtype=np.float32), name="a")
        b = cl.Buffer(shape=(256,), dtype=np.float32, name="b")

        def gather(cgh):
            r = a.access(cgh, cl.all(), cl.read)
            w = b.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((256,), lambda c: w.__setitem__(c, r[...].sum()), name="gather")

        def bump(cgh):
            rw = a.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for((256,), lambda c: rw.__setitem__(c, rw[c] + 1), name="bump")

        for _ in range(3):
            q.submit(bump)
            q.submit(gather)
        return q.fence(b).result()[0]

    res = run_cluster(program, nodes=2, devices=2, CELERITAS_TRACE=str(trace))
    assert res[0] == res[1] == float(np.arange(256).sum() + 3 * 256)
    doc = json.loads(trace.read_text())
    out = tmp_path / "t.svg"
    tl = timeline.render(trace, out)
    assert tl.ranks == [0, 1]
    _check_svg(ET.parse(out).getroot(), doc)


# ------------------------------------------------------------------- synthetic traces


def _doc(slices, names=None):
    """A trace in celeritas' shape: slices are (rank, lane, kind, start, dur, args)."""
    ev = []
    tids: dict[tuple[int, str], int] = {}
    for rank, lane, *_ in slices:
        if (rank, lane) not in tids:
            tids[(rank, lane)] = len([k for k in tids if k[0] == rank]) + 1
            ev.append({"ph": "M", "name": "thread_name", "pid": rank + 1, "tid": tids[(rank, lane)],
                       "args": {"name": lane}})
    for rank in {s[0] for s in slices}:
        ev.append({"ph": "M", "name": "process_name", "pid": rank + 1, "tid": 0,
                   "args": {"name": (names or {}).get(rank, f"rank {rank}")}})
    for i, (rank, lane, kind, start, dur, args) in enumerate(slices):
        ev.append({"ph": "X", "name": kind, "cat": kind, "pid": rank + 1, "tid": tids[(rank, lane)], "ts": start,
                   "dur": dur, "args": {"instruction": i, **args}})
    return {"traceEvents": ev}


def test_busy_share_is_the_union_of_a_lanes_intervals():
    tl = timeline.parse(_doc([(0, "device D0 lane 0", "copy", 0, 10, {}),
                              (0, "device D0 lane 0", "device_kernel", 5, 15, {}),
                              (0, "host lane 0", "host_task", 30, 10, {})]))
    (dev, host) = tl.rows
    assert tl.span == 40
    assert dev.busy == 20 and host.busy == 10
    root = ET.fromstring(timeline.to_svg(timeline.layout(tl)))
    labels = {t.get("data-lane"): t for t in root.iter(f"{SVG}text") if t.get("class") == "row-label"}
    assert labels["device D0 lane 0"].get("data-busy") == "0.5000"
    assert labels["device D0 lane 0"].text.endswith("50 % busy")
    assert labels["host lane 0"].text.endswith("25 % busy")


def test_extra_rows_of_a_lane_fold_into_one_row_in_lane_order():
    tl = timeline.parse(_doc([(1, "MPI (send / receive)", "receive", 0, 50, {"transfer": [1, 0, 0]}),
                              (1, "MPI (send / receive) #2", "receive", 10, 50, {"transfer": [2, 0, 0]}),
                              (1, "device D0 lane 0", "device_kernel", 0, 5, {}),
                              (0, "alloc queue", "alloc", 0, 1, {})]))
    assert [(r.rank, r.lane, len(r.slices)) for r in tl.rows] == [
        (0, "alloc queue", 1), (1, "MPI (send / receive)", 2), (1, "device D0 lane 0", 1)]
    assert tl.rows[1].busy == 60


def test_sends_join_the_receive_of_their_transfer_on_the_target_rank():
    tl = timeline.parse(_doc([
        (0, "MPI (send / receive)", "send", 10, 5, {"transfer": [3, 0, 0], "to_rank": 1, "bytes": 64}),
        (0, "MPI (send / receive)", "send", 12, 5, {"transfer": [9, 0, 0], "to_rank": 1, "bytes": 8}),
        (1, "MPI (send / receive)", "await_receive", 0, 40, {"transfer": [3, 0, 0]}),
        (1, "MPI (send / receive)", "receive", 2, 20, {"transfer": [3, 0, 0]}),
        (1, "MPI (send / receive)", "receive", 2, 30, {"transfer": [4, 0, 0]}),
    ]))
    assert len(tl.transfers) == 1 and tl.unmatched_sends == 1
    (t,) = tl.transfers
    assert (tl.rows[t.src].rank, tl.rows[t.dst].rank, t.start, t.end, t.bytes) == (0, 1, 10, 22, 64)
    svg = timeline.to_svg(timeline.layout(tl))
    assert "1 sends whose receive is not in this trace" in svg
    root = ET.fromstring(svg)
    (line,) = [ln for ln in root.iter(f"{SVG}line") if ln.get("class") == "transfer"]
    assert (line.get("data-from-rank"), line.get("data-to-rank")) == ("0", "1")
    assert float(line.get("x1")) < float(line.get("x2"))


def test_dense_rows_are_merged_below_a_pixel_and_show_counts():
    n = 5000
    slices = [(0, "device D0 lane 0", "device_kernel", i * 1.0, 0.5, {}) for i in range(n)]
    slices += [(0, "device D0 lane 0", "copy", 20000.0 + i * 100.0, 1.0, {}) for i in range(20)]
    tl = timeline.parse(_doc(slices))
    scene = timeline.layout(tl, width=1200)
    root = ET.fromstring(timeline.to_svg(scene))
    bars = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"]
    assert sum(int(b.get("data-count")) for b in bars) == n + 20
    assert len(bars) < 1200
    kernels = [b for b in bars if b.get("data-kind") == "device_kernel"]
    assert len(kernels) == 1 and kernels[0].get("data-count") == str(n)     # 1 us apart, < 1 pixel
    assert "5000 \u00d7 device_kernel" in kernels[0].find(f"{SVG}title").text
    assert any(t.text == f"\u00d7{n}" for t in root.iter(f"{SVG}text") if t.get("class") == "count")
    copies = [b for b in bars if b.get("data-kind") == "copy"]
    assert len(copies) == 20                                                 # 100 us apart: several pixels


def test_dense_transfers_are_merged_into_fewer_lines():
    slices = []
    for i in range(3000):
        slices.append((0, "MPI (send / receive)", "send", i * 10.0, 2.0, {"transfer": [i, 0, 0], "to_rank": 1}))
        slices.append((1, "MPI (send / receive)", "receive", i * 10.0, 5.0, {"transfer": [i, 0, 0]}))
    tl = timeline.parse(_doc(slices))
    root = ET.fromstring(timeline.to_svg(timeline.layout(tl, width=1200)))
    lines = [ln for ln in root.iter(f"{SVG}line") if ln.get("class") == "transfer"]
    assert len(lines) <= 1200 // 6
    assert sum(int(ln.get("data-count")) for ln in lines) == 3000


def test_time_axis_is_in_milliseconds():
    tl = timeline.parse(_doc([(0, "host lane 0", "host_task", 0, 25_000, {})]))     # 25 ms
    root = ET.fromstring(timeline.to_svg(timeline.layout(tl)))
    ticks = [t for t in root.iter(f"{SVG}text") if t.get("class") == "tick"]
    values = [float(t.text) for t in ticks]
    assert [t.text for t in ticks] == ["0.0", "2.5", "5.0", "7.5", "10.0", "12.5", "15.0", "17.5", "20.0", "22.5",
                                       "25.0"]
    xs = [float(t.get("x")) for t in ticks]
    # evenly spaced, and 25 ms lies at the end of the 25 ms bar
    assert all(abs((xs[i + 1] - xs[i]) - (xs[1] - xs[0])) < 1e-6 for i in range(len(xs) - 1))
    (bar,) = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"]
    assert abs(float(bar.get("x")) + float(bar.get("width")) - xs[values.index(25.0)]) < 1e-6
    assert any("(ms)" in (t.text or "") for t in root.iter(f"{SVG}text"))


def test_a_trace_of_one_instant_still_draws(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(_doc([(0, "executor (immediate)", "epoch", 5, 0, {})])))
    tl = timeline.render(trace, tmp_path / "t.png")
    assert tl.span == 0 and tl.instructions == 1
    from PIL import Image
    with Image.open(tmp_path / "t.png") as img:
        assert img.size[0] == 1600


def test_gzipped_trace_and_default_output(tmp_path, capsys):
    doc = _doc([(0, "host lane 0", "host_task", 0, 10, {})])
    path = tmp_path / "run.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert main(["trace", str(path)]) == 0
    assert (tmp_path / "run.html").exists()
    assert "wrote" in capsys.readouterr().err


@pytest.mark.parametrize("content, output, words", [
    (None, "t.svg", "no such file"),
    (b"\x89PNG\r\n\x1a\n....", "t.svg", "is not a trace file: it is not JSON"),
    (b'{"nodes": []}', "t.svg", "is not a Chrome trace-event file"),
    (b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "rank 0"}}]}', "t.svg",
     "holds no executed instructions"),
    (b'{"traceEvents": [{"ph": "X", "pid": 1, "tid": 1, "dur": 3}]}', "t.svg", "malformed event"),
    (json.dumps(_doc([(0, "host lane 0", "host_task", 0, 10, {})])).encode(), "t.pdf",
     "the output must end in .png, .svg or .html"),
])
def test_bad_input_is_a_clear_error_with_exit_status_2(tmp_path, capsys, content, output, words):
    trace = tmp_path / "trace.json"
    if content is not None:
        trace.write_bytes(content)
    assert main(["trace", str(trace), "-o", str(tmp_path / output)]) == 2
    err = capsys.readouterr().err
    assert words in " ".join(err.split()) and "Traceback" not in err
    assert not (tmp_path / output).exists()


def test_png_without_pillow_names_the_package_and_the_extra(tmp_path, monkeypatch):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(_doc([(0, "host lane 0", "host_task", 0, 10, {})])))
    monkeypatch.setitem(sys.modules, "PIL", None)       # makes ``import PIL`` fail
    with pytest.raises(cl.ConfigError, match=r"needs Pillow.*pip install 'celeritas\[dev\]'"):
        timeline.render(trace, tmp_path / "t.png")
    timeline.render(trace, tmp_path / "t.svg")           # SVG and HTML need neither Pillow nor matplotlib
    timeline.render(trace, tmp_path / "t.html")
    assert (tmp_path / "t.svg").stat().st_size > 0 and (tmp_path / "t.html").stat().st_size > 0
