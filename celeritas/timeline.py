"""The execution timeline of a ``CELERITAS_TRACE`` file, drawn without a browser.

``python -m celeritas trace trace.json -o timeline.png`` (or ``.svg``, ``.html``).
Perfetto shows the same file interactively, but needs a browser with internet access,
which cluster login nodes rarely have; this draws a picture where the trace lies.

The picture has one row per rank and executor lane (the trace's extra rows ``#2``,
``#3`` of a lane, which only exist because Perfetto tracks cannot hold overlapping
slices, are folded back into their lane), one bar per instruction coloured by its kind,
and a line from every send to the receive that takes its data on the other rank
(matched like the trace's flow arrows: same transfer id, on the send's target rank).
Each row label gives the lane's busy share: the union of its instructions' intervals
over the span of the whole trace.

Thousands of instructions are more than a picture has pixels, so bars of one kind in
one row that lie less than a pixel apart are merged into one bar that carries their
count (written on the bar when it fits, and in the tooltip of the SVG and HTML).
Transfers between the same two rows that start and end in the same pixel columns are
merged the same way.

Everything is laid out once, in pixels, as a list of shapes; the SVG and HTML writers
print those shapes and the PNG writer paints them with Pillow (at twice the size, then
scaled down, which antialiases text and slanted lines).  SVG and HTML need nothing
beyond the standard library.
"""
from __future__ import annotations

import gzip
import html
import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from scheduler.errors import ConfigError

from .graphs import fmt_bytes, visible_text

FORMATS = (".png", ".svg", ".html")
MIN_WIDTH = 400
# The widest picture drawn: the PNG writer paints at twice the size, so 16384 pixels are a
# 32768-pixel canvas, already hundreds of MB for a trace of many ranks and lanes; a
# larger --width (a typo, an extra zero) would exhaust memory instead of drawing anything.
MAX_WIDTH = 16384
# The PNG writer paints at twice the size unless that canvas would exceed this many pixels
# (about 800 MB of RGB), then at the size itself; beyond it even that is refused.
_MAX_CANVAS_PIXELS = 1 << 28

# the instruction kinds of the trace, coloured in the spirit of the graph pictures
KIND_COLOURS: dict[str, str] = {
    "device_kernel": "#f28e2b",
    "host_task": "#e15759",
    "copy": "#59a14f",
    "alloc": "#76b7b2",
    "free": "#a0cbe8",
    "send": "#d4447a",
    "receive": "#8e63b5",
    "split_receive": "#b07aa1",
    "await_receive": "#d3b5e5",
    "gather_receive": "#6b4c9a",
    "fill_identity": "#4e79a7",
    "reduce": "#2f4b7c",
    "fence": "#bab0ac",
    "horizon": "#79706e",
    "epoch": "#3b3b3b",
    "destroy_host_object": "#edc948",
    "clone_collective_group": "#9c2a2a",
}
_SPARE_COLOURS = ("#17becf", "#bcbd22", "#7f7f7f", "#8c564b", "#e377c2", "#1f77b4")
TRANSFER_COLOUR = "#1d3557"

RECEIVE_KINDS = ("receive", "split_receive", "gather_receive", "await_receive")
_EXTRA_ROW = re.compile(r"\s+#\d+$")
_RANK = re.compile(r"rank\s+(\d+)")


# ------------------------------------------------------------------------------ model


@dataclass(slots=True)
class Slice:
    """One executed instruction, times in microseconds from the start of the trace."""

    start: float
    end: float
    kind: str
    name: str
    args: Mapping[str, Any]


@dataclass(slots=True)
class Row:
    """One lane of one rank."""

    rank: int
    lane: str
    order: int
    slices: list[Slice] = field(default_factory=list)
    busy: float = 0.0     # microseconds covered by at least one of its slices

    def share(self, span: float) -> float:
        return self.busy / span if span > 0 else 0.0


@dataclass(slots=True)
class Transfer:
    """A send and the receive it feeds: rows (indices into ``Timeline.rows``) and times."""

    src: int
    dst: int
    start: float          # the send starts
    end: float            # the receive completes: the data has arrived
    bytes: int


@dataclass(slots=True)
class Timeline:
    source: str
    rows: list[Row]
    transfers: list[Transfer]
    start: float
    end: float
    rank_labels: dict[int, str]
    unmatched_sends: int = 0

    @property
    def span(self) -> float:
        return self.end - self.start

    @property
    def ranks(self) -> list[int]:
        return sorted({r.rank for r in self.rows})

    def kinds(self) -> Counter:
        return Counter(s.kind for r in self.rows for s in r.slices)

    @property
    def instructions(self) -> int:
        return sum(len(r.slices) for r in self.rows)


def load(path: str | Path) -> Timeline:
    """Read a trace file (``.json`` or ``.json.gz``), or raise ``ConfigError`` saying what is wrong."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"trace: no such file: {p} (write one with CELERITAS_TRACE={p} python program.py)")
    if not p.is_file():
        raise ConfigError(f"trace: {p} is not a file")
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
    except (OSError, EOFError) as exc:
        raise ConfigError(f"trace: cannot read {p}: {exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"trace: {p} is not a trace file: it is not JSON ({exc})") from None
    return parse(doc, str(p))


def parse(doc: Any, source: str = "trace") -> Timeline:
    """The timeline of a Chrome trace-event document as ``celeritas.trace.build_trace`` writes it.

    Other Chrome traces work too as long as they have complete (``"ph": "X"``) events;
    processes and threads without names are then labelled by their ids.
    """
    if isinstance(doc, dict):
        events = doc.get("traceEvents")
    elif isinstance(doc, list):      # the JSON-array form of the format
        events = doc
    else:
        events = None
    if not isinstance(events, list):
        raise ConfigError(f"trace: {source} is not a Chrome trace-event file (no traceEvents list); "
                          f"CELERITAS_TRACE=FILE writes one")
    proc_names: dict[Any, str] = {}
    proc_sort: dict[Any, int] = {}
    thread_names: dict[tuple, str] = {}
    thread_sort: dict[tuple, int] = {}
    xs: list[dict] = []
    try:
        for e in events:
            if not isinstance(e, dict):
                continue
            ph = e.get("ph")
            if ph == "X":
                xs.append(e)
            elif ph == "M":
                args = _args(e, source)
                key = e.get("pid")
                if e.get("name") == "process_name":
                    proc_names[key] = str(args.get("name", ""))
                elif e.get("name") == "process_sort_index":
                    proc_sort[key] = _int(args.get("sort_index"), 0)
                elif e.get("name") == "thread_name":
                    thread_names[(key, e.get("tid"))] = str(args.get("name", ""))
                elif e.get("name") == "thread_sort_index":
                    thread_sort[(key, e.get("tid"))] = _int(args.get("sort_index"), 0)
    except TypeError as exc:     # an unhashable pid or tid
        raise ConfigError(f"trace: {source} has a malformed metadata event (TypeError: {exc})") from None
    if not xs:
        raise ConfigError(f"trace: {source} holds no executed instructions (no complete 'X' events)")

    def rank_of(pid: Any) -> int:
        m = _RANK.match(proc_names.get(pid, ""))
        if m:
            return int(m.group(1))
        if pid in proc_sort:
            return proc_sort[pid]
        return _int(pid, 1) - 1      # celeritas numbers processes rank + 1

    rows: dict[tuple[int, str], Row] = {}
    rank_labels: dict[int, str] = {}
    t0 = math.inf
    t1 = -math.inf
    try:
        for e in xs:
            pid, tid = e.get("pid"), e.get("tid")
            rank = rank_of(pid)
            rank_labels.setdefault(rank, proc_names.get(pid) or f"rank {rank}")
            lane = _EXTRA_ROW.sub("", thread_names.get((pid, tid)) or f"thread {tid}")
            row = rows.get((rank, lane))
            if row is None:
                row = rows[(rank, lane)] = Row(rank, lane, thread_sort.get((pid, tid), _int(tid, 0)))
            else:
                row.order = min(row.order, thread_sort.get((pid, tid), _int(tid, 0)))
            start = _time(e, "ts", source)
            end = start + max(_time(e, "dur", source), 0.0)
            if not math.isfinite(end):
                raise ConfigError(f"trace: {source} has a malformed event: its 'ts' + 'dur' overflows")
            args = _args(e, source)
            kind = str(e.get("cat") or args.get("kind") or e.get("name") or "?")
            row.slices.append(Slice(start, end, kind, str(e.get("name", kind)), args))
            t0 = min(t0, start)
            t1 = max(t1, end)
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"trace: {source} has a malformed event ({type(exc).__name__}: {exc})") from None
    ordered = sorted(rows.values(), key=lambda r: (r.rank, r.order, r.lane))
    for r in ordered:
        r.slices.sort(key=lambda s: (s.start, s.end))
        r.busy = _union_length((s.start, s.end) for s in r.slices)
    transfers, unmatched = _transfers(ordered)
    return Timeline(source, ordered, transfers, t0, t1 if t1 > t0 else t0, rank_labels, unmatched)


def _args(e: Mapping, source: str) -> Mapping:
    """An event's ``args``: an object (or absent); anything else is a malformed trace.

    The ids the timeline matches transfers by must be plain values: a ``transfer`` that
    is a list of numbers or strings, a ``to_rank`` that is a number."""
    args = e.get("args")
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise ConfigError(f"trace: {source} has a malformed {e.get('ph')!r} event: its 'args' is "
                          f"{type(args).__name__}, not an object")
    tr = args.get("transfer")
    if tr is not None and not (isinstance(tr, list) and all(isinstance(v, (int, float, str)) for v in tr)):
        raise ConfigError(f"trace: {source} has a malformed event: its 'transfer' {tr!r} is not a list of ids")
    peer = args.get("to_rank")
    if peer is not None and not isinstance(peer, (int, float, str)):
        raise ConfigError(f"trace: {source} has a malformed event: its 'to_rank' {peer!r} is not a rank")
    return args


def _time(e: Mapping, key: str, source: str) -> float:
    """An event's ``ts`` or ``dur`` in microseconds (``dur`` may be absent); NaN and
    infinities (which JSON readers accept) would break every position computed from them."""
    raw = e[key] if key == "ts" else (e.get(key) or 0.0)
    value = float(raw)
    if not math.isfinite(value):
        raise ConfigError(f"trace: {source} has a malformed event: its {key!r} is {raw!r}, not a finite number")
    return value


def _int(v: Any, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    total = 0.0
    cur_a = cur_b = None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        elif b > cur_b:
            cur_b = b
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def _transfers(rows: Sequence[Row]) -> tuple[list[Transfer], int]:
    """Each send joined to the receive of its transfer on its target rank.

    The receiving side is the first receive-like instruction of that transfer, preferring
    ``receive`` over ``split_receive`` over ``gather_receive`` over ``await_receive``: the
    same choice as the trace's own flow arrows, so the picture agrees with Perfetto.
    """
    receivers: dict[tuple[int, tuple], tuple[int, Slice]] = {}
    candidates = []
    for i, row in enumerate(rows):
        for s in row.slices:
            tr = s.args.get("transfer")
            if s.kind in RECEIVE_KINDS and isinstance(tr, list):
                candidates.append((RECEIVE_KINDS.index(s.kind), s.start, row.rank, tuple(tr), i, s))
    for _pref, _start, rank, tr, i, s in sorted(candidates, key=lambda c: (c[0], c[1])):
        receivers.setdefault((rank, tr), (i, s))
    out: list[Transfer] = []
    unmatched = 0
    for i, row in enumerate(rows):
        for s in row.slices:
            if s.kind != "send":
                continue
            tr, peer = s.args.get("transfer"), s.args.get("to_rank")
            hit = receivers.get((peer, tuple(tr))) if isinstance(tr, list) and peer is not None else None
            if hit is None:
                unmatched += 1
                continue
            j, r = hit
            out.append(Transfer(i, j, s.start, r.end, _int(s.args.get("bytes"), 0)))
    return out, unmatched


# ------------------------------------------------------------------------ aggregation


@dataclass(slots=True)
class Bar:
    """Instructions of one kind in one row, merged because they lie within a pixel of each other."""

    start: float
    end: float
    kind: str
    count: int
    busy: float
    names: Counter


def bars(row: Row, us_per_px: float) -> list[Bar]:
    """``row``'s slices per kind, neighbours closer than ``us_per_px`` merged."""
    out: list[Bar] = []
    by_kind: dict[str, list[Slice]] = defaultdict(list)
    for s in row.slices:
        by_kind[s.kind].append(s)
    for kind, slices in by_kind.items():
        cur: Bar | None = None
        for s in slices:   # sorted by start
            if cur is not None and s.start <= cur.end + us_per_px:
                cur.end = max(cur.end, s.end)
                cur.count += 1
                cur.busy += s.end - s.start
                cur.names[s.name] += 1
            else:
                cur = Bar(s.start, s.end, kind, 1, s.end - s.start, Counter({s.name: 1}))
                out.append(cur)
    return out


@dataclass(slots=True)
class TransferLine:
    src: int
    dst: int
    start: float
    end: float
    count: int
    bytes: int


def transfer_lines(transfers: Sequence[Transfer], start: float, us_per_px: float,
                   max_lines: int | None = None) -> list[TransferLine]:
    """Transfers between the same rows whose ends fall in the same columns, merged.

    Columns are a pixel wide, and twice as wide as often as needed to keep the lines to
    ``max_lines``: a line every few pixels is as dense as a reader can follow.
    """
    column = us_per_px
    while True:
        groups: dict[tuple, TransferLine] = {}
        for t in transfers:
            key = (t.src, t.dst, int((t.start - start) // column), int((t.end - start) // column))
            g = groups.get(key)
            if g is None:
                groups[key] = TransferLine(t.src, t.dst, t.start, t.end, 1, t.bytes)
            else:
                g.count += 1
                g.bytes += t.bytes
        if max_lines is None or len(groups) <= max_lines or column > 1e12:
            return list(groups.values())
        column *= 2


# ------------------------------------------------------------------------------ layout


@dataclass(slots=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    fill: str
    title: str = ""
    cls: str = ""
    attrs: dict = field(default_factory=dict)
    stroke: str = ""


@dataclass(slots=True)
class Line:
    x1: float
    y1: float
    x2: float
    y2: float
    stroke: str
    width: float = 1.0
    opacity: float = 1.0
    title: str = ""
    cls: str = ""
    attrs: dict = field(default_factory=dict)
    dot: bool = False       # a small disc at (x2, y2): where the data arrived


@dataclass(slots=True)
class Text:
    x: float
    y: float               # baseline
    text: str
    size: float = 12.0
    fill: str = "#222222"
    anchor: str = "start"  # start | middle | end
    bold: bool = False
    cls: str = ""
    attrs: dict = field(default_factory=dict)


@dataclass(slots=True)
class Scene:
    width: int
    height: int
    shapes: list
    title: str


_CHAR_W = 0.6           # average glyph width per font size (sans-serif), for layout only
_ROW_H = 18
_BAR_H = 12
_RANK_H = 22
_PAD = 12


def palette(kinds: Iterable[str]) -> dict[str, str]:
    """A colour per kind: the fixed ones, then spare colours for kinds this module does not know."""
    kinds = set(kinds)
    out = {k: KIND_COLOURS[k] for k in kinds if k in KIND_COLOURS}
    for i, k in enumerate(sorted(k for k in kinds if k not in KIND_COLOURS)):
        out[k] = _SPARE_COLOURS[i % len(_SPARE_COLOURS)]
    return out


def _text_colour(fill: str) -> str:
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#ffffff"


def _ms(us: float) -> str:
    ms = us / 1000.0
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 1:
        return f"{ms:.2f} ms"
    return f"{ms:.3f} ms"


def _ticks(span_ms: float, target: int = 10) -> list[float]:
    if span_ms <= 0:
        return [0.0]
    raw = span_ms / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = int(span_ms / step + 1e-9)
    return [i * step for i in range(n + 1)]


def _tick_label(v: float, step: float) -> str:
    """``v`` with as many decimals as the step needs (2.5 ms steps: 0, 2.5, 5.0, 7.5)."""
    decimals = next((d for d in range(7) if abs(step * 10 ** d - round(step * 10 ** d)) < 1e-6), 6)
    return f"{v:.{decimals}f}"


def layout(tl: Timeline, width: int = 1600) -> Scene:
    """Every shape of the picture, in pixels; ``width`` is the whole picture's."""
    span = tl.span
    kinds = tl.kinds()
    colours = palette(kinds)
    labels = [f"{r.lane} \u00b7 {100 * r.share(span):.0f} % busy" for r in tl.rows]
    label_w = min(420, max(160, int(max(len(s) for s in labels) * 12 * _CHAR_W) + 2 * _PAD))
    x0 = label_w + _PAD
    plot_w = max(200, width - x0 - 2 * _PAD)
    width = x0 + plot_w + 2 * _PAD
    us_per_px = (span / plot_w) if span > 0 else 1.0

    def x_of(t: float) -> float:
        return x0 + ((t - tl.start) / us_per_px if span > 0 else 0.0)

    shapes: list = []
    title = (f"celeritas timeline \u00b7 {Path(tl.source).name} \u00b7 {len(tl.ranks)} rank"
             f"{'s' if len(tl.ranks) != 1 else ''} \u00b7 {tl.instructions} instructions \u00b7 {_ms(span)}")
    shapes.append(Text(_PAD, _PAD + 14, title, size=16, bold=True, cls="title"))
    y = _PAD + 30
    row_y: list[float] = []
    plot_top = y
    for rank in tl.ranks:
        rank_rows = [i for i, r in enumerate(tl.rows) if r.rank == rank]
        n_instr = sum(len(tl.rows[i].slices) for i in rank_rows)
        band_h = _RANK_H + _ROW_H * len(rank_rows) + 4
        shapes.append(Rect(_PAD / 2, y, width - _PAD, band_h, "#f3f3f3" if rank % 2 == 0 else "#e9eef5",
                           cls="rank", attrs={"data-rank": rank}))
        shapes.append(Text(_PAD, y + 15, f"{tl.rank_labels.get(rank, f'rank {rank}')} \u00b7 {n_instr} instructions",
                           size=13, bold=True, cls="rank-label", attrs={"data-rank": rank}))
        y += _RANK_H
        for i in rank_rows:
            row = tl.rows[i]
            row_y.append(y)
            shapes.append(Rect(x0, y + (_ROW_H - _BAR_H) / 2, plot_w, _BAR_H, "#ffffff", cls="lane-bg",
                               stroke="#dddddd"))
            shapes.append(Text(x0 - 6, y + _ROW_H / 2 + 4, labels[i], size=12, anchor="end", cls="row-label",
                               attrs={"data-rank": row.rank, "data-lane": row.lane,
                                      "data-busy": f"{row.share(span):.4f}",
                                      "data-instructions": len(row.slices)}))
            bs = bars(row, us_per_px)
            bs.sort(key=lambda b: -(b.end - b.start))      # long bars first, short ones on top
            counts: list[Text] = []
            taken: list[tuple[float, float]] = []     # (centre, width) of the count labels placed
            for b in bs:
                bx = x_of(b.start)
                bw = max(1.0, x_of(b.end) - bx)
                fill = colours[b.kind]
                top = ", ".join(f"{n} \u00d7{c}" if c > 1 else n for n, c in b.names.most_common(3))
                tip = (f"R{row.rank} {row.lane}: {b.count} \u00d7 {b.kind}, {_ms(b.busy)} busy in "
                       f"{_ms(b.end - b.start)} from {_ms(b.start - tl.start)}" if b.count > 1 else
                       f"R{row.rank} {row.lane}: {top} ({b.kind}), {_ms(b.busy)} from {_ms(b.start - tl.start)}")
                if b.count > 1 and len(b.names) > 1:
                    more = ", \u2026" if len(b.names) > 3 else ""
                    tip += f" ({top}{more})"
                shapes.append(Rect(bx, y + (_ROW_H - _BAR_H) / 2, bw, _BAR_H, fill, title=tip, cls="bar",
                                   attrs={"data-kind": b.kind, "data-count": b.count}))
                label = f"\u00d7{b.count}" if b.count > 1 else ""
                lw = len(label) * 9 * _CHAR_W + 4
                cx = bx + bw / 2
                if label and bw >= lw and not any(abs(cx - ox) < (lw + ow) / 2 for ox, ow in taken):
                    taken.append((cx, lw))
                    counts.append(Text(bx + bw / 2, y + _ROW_H / 2 + 3, label, size=9, anchor="middle",
                                       fill=_text_colour(fill), cls="count"))
            shapes.extend(counts)      # over every bar of the row, so no later bar hides one
            y += _ROW_H
        y += 4
    plot_bottom = y
    # transfers over the rows
    lines = transfer_lines(tl.transfers, tl.start, us_per_px, max_lines=max(20, plot_w // 6))
    opacity = 0.55 if len(lines) <= 60 else max(0.2, 0.55 * math.sqrt(60 / len(lines)))
    for t in lines:
        y1 = row_y[t.src] + _ROW_H / 2
        y2 = row_y[t.dst] + _ROW_H / 2
        what = f"{t.count} transfers" if t.count > 1 else "transfer"
        tip = (f"{what} R{tl.rows[t.src].rank} \u2192 R{tl.rows[t.dst].rank}, {fmt_bytes(t.bytes)}: send at "
               f"{_ms(t.start - tl.start)}, received by {_ms(t.end - tl.start)}")
        shapes.append(Line(x_of(t.start), y1, x_of(t.end), y2, TRANSFER_COLOUR,
                           width=min(3.0, 1.0 + math.log2(t.count)), opacity=opacity, title=tip, cls="transfer",
                           attrs={"data-from-rank": tl.rows[t.src].rank, "data-to-rank": tl.rows[t.dst].rank,
                                  "data-count": t.count}, dot=True))
    # time axis
    ticks = _ticks(span / 1000.0)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    for v in ticks:
        x = x_of(tl.start + v * 1000.0)
        shapes.append(Line(x, plot_top, x, plot_bottom + 4, "#000000", width=1.0, opacity=0.12, cls="grid"))
        shapes.append(Text(x, plot_bottom + 18, _tick_label(v, step), size=11, anchor="middle", cls="tick"))
    shapes.append(Line(x0, plot_bottom + 4, x0 + plot_w, plot_bottom + 4, "#444444", cls="axis"))
    shapes.append(Text(x0 + plot_w / 2, plot_bottom + 36, "time since the first instruction (ms)", size=12,
                       anchor="middle", cls="axis-label"))
    # legend: kinds present, with counts, then the transfer line
    y = plot_bottom + 58
    x = x0
    order = [k for k in KIND_COLOURS if k in kinds] + sorted(k for k in kinds if k not in KIND_COLOURS)
    entries: list[tuple[str, str | None]] = [(f"{k} ({kinds[k]})", colours[k]) for k in order]
    entries.append((f"transfer: send \u2192 receive on the other rank ({len(tl.transfers)})", None))
    if tl.unmatched_sends:
        entries.append((f"{tl.unmatched_sends} sends whose receive is not in this trace", ""))
    for text, colour in entries:
        w = 22 + len(text) * 12 * _CHAR_W + 18
        if x + w > x0 + plot_w and x > x0:
            x = x0
            y += 20
        if colour:
            shapes.append(Rect(x, y - 10, 14, 12, colour, cls="legend-swatch", attrs={"data-kind": text}))
        elif colour is None:
            shapes.append(Line(x, y - 2, x + 14, y - 6, TRANSFER_COLOUR, width=2, opacity=0.8, cls="legend-line"))
        shapes.append(Text(x + 20, y, text, size=12, cls="legend"))
        x += w
    height = int(y + 2 * _PAD)
    return Scene(int(width), height, shapes, title)


# ----------------------------------------------------------------------------- writers


def _xml(text: Any) -> str:
    """``text`` for SVG and HTML: markup escaped, and control characters (names come from
    the trace, so from users) shown as ``\\x01``: raw, they make the SVG ill-formed XML."""
    return html.escape(visible_text(text), quote=True)


def _attrs(d: Mapping) -> str:
    return "".join(f' {k}="{_xml(v)}"' for k, v in d.items())


def to_svg(scene: Scene) -> str:
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{scene.width}" height="{scene.height}" '
           f'viewBox="0 0 {scene.width} {scene.height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
           f"<title>{_xml(scene.title)}</title>",
           f'<rect x="0" y="0" width="{scene.width}" height="{scene.height}" fill="#ffffff"/>']
    for s in scene.shapes:
        cls = f' class="{s.cls}"' if s.cls else ""
        if isinstance(s, Rect):
            stroke = f' stroke="{s.stroke}" stroke-width="0.5"' if s.stroke else ""
            body = (f'<rect{cls} x="{s.x:.2f}" y="{s.y:.2f}" width="{s.w:.2f}" height="{s.h:.2f}" '
                    f'fill="{s.fill}"{stroke}{_attrs(s.attrs)}')
            out.append(body + (f"><title>{_xml(s.title)}</title></rect>" if s.title else "/>"))
        elif isinstance(s, Line):
            body = (f'<line{cls} x1="{s.x1:.2f}" y1="{s.y1:.2f}" x2="{s.x2:.2f}" y2="{s.y2:.2f}" '
                    f'stroke="{s.stroke}" stroke-width="{s.width:.2f}" stroke-opacity="{s.opacity:.2f}"'
                    f'{_attrs(s.attrs)}')
            out.append(body + (f"><title>{_xml(s.title)}</title></line>" if s.title else "/>"))
            if s.dot:
                out.append(f'<circle cx="{s.x2:.2f}" cy="{s.y2:.2f}" r="2.2" fill="{s.stroke}" '
                           f'fill-opacity="{min(1.0, s.opacity + 0.2):.2f}"/>')
        elif isinstance(s, Text):
            anchor = "" if s.anchor == "start" else f' text-anchor="{s.anchor}"'
            weight = ' font-weight="bold"' if s.bold else ""
            out.append(f'<text{cls} x="{s.x:.2f}" y="{s.y:.2f}" font-size="{s.size:g}" fill="{s.fill}"'
                       f'{anchor}{weight}{_attrs(s.attrs)}>{_xml(s.text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def to_html(tl: Timeline, scene: Scene) -> str:
    """One self-contained page: the picture (tooltips on hover) and the per-lane numbers."""
    span = tl.span
    rows = "\n".join(
        f"<tr><td>R{r.rank}</td><td>{_xml(r.lane)}</td><td>{len(r.slices)}</td>"
        f"<td>{_ms(r.busy)}</td><td>{100 * r.share(span):.1f} %</td></tr>" for r in tl.rows)
    kinds = tl.kinds()
    colours = palette(kinds)
    kind_rows = "\n".join(
        f'<tr><td><span class="sw" style="background:{colours[k]}"></span>{_xml(k)}</td>'
        f"<td>{n}</td></tr>" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{_xml(scene.title)}</title>
<style>
body {{ font-family: DejaVu Sans, Helvetica, Arial, sans-serif; margin: 1em; color: #222; }}
.picture {{ overflow-x: auto; border: 1px solid #ddd; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ddd; padding: 2px 8px; text-align: right; }}
td:nth-child(2), th:nth-child(2), .kinds td:first-child {{ text-align: left; }}
.sw {{ display: inline-block; width: 12px; height: 12px; margin-right: 6px; vertical-align: middle; }}
svg rect.bar:hover {{ stroke: #000; stroke-width: 1; }}
svg line.transfer:hover {{ stroke-opacity: 1; stroke-width: 3; }}
</style></head>
<body>
<p>{_xml(tl.source)}: {len(tl.ranks)} rank{'s' if len(tl.ranks) != 1 else ''}, {tl.instructions}
instructions, {len(tl.transfers)} transfers between ranks, {_ms(span)} from the first instruction to the last.
Hover a bar or a line for what it holds; bars of one kind closer than a pixel are merged and show their count.</p>
<div class="picture">
{to_svg(scene)}</div>
<table><thead><tr><th>rank</th><th>lane</th><th>instructions</th><th>busy</th><th>of the trace</th></tr></thead>
<tbody>
{rows}
</tbody></table>
<table class="kinds"><thead><tr><th>kind</th><th>instructions</th></tr></thead>
<tbody>
{kind_rows}
</tbody></table>
</body></html>
"""


def to_png(scene: Scene, path: Path, scale: int = 2) -> None:
    """Paint ``scene`` with Pillow at ``scale`` times the size and scale it down (antialiasing)."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise ConfigError("trace: PNG output needs Pillow, which is not installed (pip install pillow, or "
                          "pip install 'celeritas[dev]'); .svg and .html need nothing extra") from None
    if scene.width * scene.height * scale * scale > _MAX_CANVAS_PIXELS:
        scale = 1
    if scene.width * scene.height > _MAX_CANVAS_PIXELS:
        raise ConfigError(f"trace: a {scene.width} x {scene.height} pixel PNG is too large to paint; "
                          f"write .svg or .html, or give a smaller --width")
    W, H = scene.width * scale, scene.height * scale
    img = Image.new("RGB", (W, H), "#ffffff")
    draw = ImageDraw.Draw(img)
    fonts: dict[tuple[float, bool], Any] = {}

    def font(size: float, bold: bool):
        key = (size, bold)
        if key not in fonts:
            try:
                fonts[key] = ImageFont.truetype("DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf", size * scale)
            except OSError:
                try:
                    fonts[key] = ImageFont.load_default(size=size * scale)
                except TypeError:      # Pillow without FreeType: a fixed bitmap font
                    fonts[key] = ImageFont.load_default()
        return fonts[key]

    overlay = None
    for s in scene.shapes:
        if isinstance(s, Rect):
            box = [s.x * scale, s.y * scale, (s.x + s.w) * scale - 1, (s.y + s.h) * scale - 1]
            box[2] = max(box[2], box[0])
            draw.rectangle(box, fill=s.fill, outline=s.stroke or None)
        elif isinstance(s, Line):
            colour = _rgba(s.stroke, s.opacity)
            if s.opacity < 1.0:
                if overlay is None:
                    overlay = Image.new("RGBA", (W, H), (0, 0, 0, 0))
                target = ImageDraw.Draw(overlay)
            else:
                target = draw
            target.line([s.x1 * scale, s.y1 * scale, s.x2 * scale, s.y2 * scale], fill=colour,
                        width=max(1, round(s.width * scale)))
            if s.dot:
                r = 2.2 * scale
                target.ellipse([s.x2 * scale - r, s.y2 * scale - r, s.x2 * scale + r, s.y2 * scale + r],
                               fill=_rgba(s.stroke, min(1.0, s.opacity + 0.2)))
        elif isinstance(s, Text):
            anchor = {"start": "ls", "middle": "ms", "end": "rs"}[s.anchor]
            draw.text((s.x * scale, s.y * scale), visible_text(s.text), fill=s.fill, font=font(s.size, s.bold), anchor=anchor)
    if overlay is not None:
        img = Image.alpha_composite(img.convert("RGBA"), overlay).convert("RGB")
    if scale != 1:
        img = img.resize((scene.width, scene.height), Image.LANCZOS)
    img.save(path, format="PNG", optimize=True)


def _rgba(colour: str, opacity: float) -> tuple[int, int, int, int]:
    return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16), round(255 * opacity))


def render(trace: str | Path, output: str | Path, *, width: int = 1600) -> Timeline:
    """Draw ``trace`` into ``output`` (``.png``, ``.svg`` or ``.html``); returns the timeline drawn."""
    out = Path(output)
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise ConfigError(f"trace: cannot write {out.name!r}: the output must end in .png, .svg or .html")
    if width < MIN_WIDTH:
        raise ConfigError(f"trace: --width {width} is too narrow (at least {MIN_WIDTH} pixels)")
    if width > MAX_WIDTH:
        raise ConfigError(f"trace: --width {width} is too wide (at most {MAX_WIDTH} pixels)")
    tl = load(trace)
    scene = layout(tl, width)
    try:
        if out.parent and not out.parent.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
        if suffix == ".png":
            to_png(scene, out)
        elif suffix == ".svg":
            out.write_text(to_svg(scene), encoding="utf-8")
        else:
            out.write_text(to_html(tl, scene), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"trace: cannot write {out}: {exc}") from None
    return tl
