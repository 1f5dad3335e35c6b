"""Execution trace (``CELERITAS_TRACE=file``) in Chrome trace-event JSON, for Perfetto.

A graph says what *may* run concurrently; the trace says what *did*: one process per
rank, one track per executor lane (device lanes, host lanes, the alloc queue, MPI and
the executor's own immediate work), one slice per instruction, and flow arrows for
dependencies that cross lanes (including a send to the receive it feeds on another
rank).  Arrows into and out of horizons and epochs are left out: they depend on
everything and would bury the data flow.

Every rank's executor records ``TraceEvent``s; at shutdown they are gathered to rank 0
(``RankOutputs.gather``, see ``outputs``) and rank 0 writes one file.  Open it at
https://ui.perfetto.dev (or chrome://tracing).
"""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

log = logging.getLogger("celeritas.graphs")

# TraceEvent fields in the order a payload ships them (tuples pickle small)
_FIELDS = ("instruction_id", "kind", "name", "lane", "start_ns", "end_ns", "task", "buffers", "bytes",
           "deps", "transfer", "peer")

_SYNC_KINDS = frozenset(("horizon", "epoch"))
_RECEIVE_KINDS = ("receive", "split_receive", "gather_receive", "await_receive")

_LANE_RE = re.compile(r"D(\d+)\.lane(\d+)$")
_HOST_RE = re.compile(r"host\.lane(\d+)$")


def lane_order(lane: str) -> tuple:
    """Device lanes first (by device, lane), then host lanes, alloc queue, MPI, immediate."""
    m = _LANE_RE.match(lane)
    if m:
        return (0, int(m.group(1)), int(m.group(2)))
    m = _HOST_RE.match(lane)
    if m:
        return (1, int(m.group(1)), 0)
    fixed = {"alloc": 2, "comm": 3, "immediate": 4}
    return (fixed.get(lane, 5), 0, lane)


def lane_title(lane: str) -> str:
    m = _LANE_RE.match(lane)
    if m:
        return f"device D{m.group(1)} lane {m.group(2)}"
    m = _HOST_RE.match(lane)
    if m:
        return f"host lane {m.group(1)}"
    return {"alloc": "alloc queue", "comm": "MPI (send / receive)",
            "immediate": "executor (immediate)"}.get(lane, lane)


def trace_payload(outputs) -> dict:
    """What one rank contributes: its events and how to put its clock on a shared axis.

    ``perf_counter_ns`` has an arbitrary origin per process, so each rank also sends
    one (wall clock - perf counter) offset; ranks in one process share a clock and use
    the first such offset, so their relative timing stays exact.
    """
    events = [tuple(getattr(e, f, None) for f in _FIELDS) for e in outputs.trace]
    task_names = {}
    records = outputs.records
    for rec in records["tasks"] if records is not None else ():
        if rec.get("name"):
            task_names[rec["id"]] = rec["name"]
    return {"rank": outputs.rank, "host": socket.gethostname(), "pid": os.getpid(),
            "clock_offset_ns": time.time_ns() - time.perf_counter_ns(),
            "events": events, "buffers": dict(outputs.buffer_names), "task_names": task_names,
            "backend": outputs.backend, "devices": outputs.num_devices}


def _event(t: Sequence) -> dict:
    return dict(zip(_FIELDS, t))


def _slice_name(e: Mapping, buffers: Mapping[int, str]) -> str:
    if e["kind"] in ("device_kernel", "host_task") and e.get("name"):
        return e["name"]
    name = e["name"] if e["kind"] == "copy" and e.get("name") else e["kind"]   # ("evicting copy")
    bufs = e.get("buffers") or ()
    if bufs:
        name += " " + ", ".join(f"B{b}" + (f" {buffers[b]}" if buffers.get(b) else "") for b in bufs)
    if e["kind"] == "send" and e.get("peer") is not None:
        name += f" \u2192 R{e['peer']}"
    return name


def _rows(events: Sequence[dict]) -> dict[int, tuple[str, int]]:
    """(lane, row) per event (keyed by ``id``): a track must hold properly nested slices, but
    sends and receives overlap freely on the MPI lane (and eagerly issued work may on
    others), so overlapping slices of one lane go to extra rows of that lane."""
    ends: dict[str, list[int]] = {}
    out: dict[int, tuple[str, int]] = {}
    for e in sorted(events, key=lambda x: (x["start_ns"], x["end_ns"])):
        lane_ends = ends.setdefault(e["lane"], [])
        for row, end in enumerate(lane_ends):
            if end <= e["start_ns"]:
                lane_ends[row] = e["end_ns"]
                break
        else:
            row = len(lane_ends)
            lane_ends.append(e["end_ns"])
        out[id(e)] = (e["lane"], row)
    return out


def build_trace(payloads: Iterable[Mapping | None]) -> dict:
    """The Chrome trace-event document for the gathered payloads (None entries are skipped)."""
    payloads = [p for p in payloads if p is not None]
    offsets: dict[tuple, int] = {}
    for p in payloads:
        offsets.setdefault((p["host"], p["pid"]), p["clock_offset_ns"])
    starts = [e[4] + offsets[(p["host"], p["pid"])] for p in payloads for e in p["events"]]
    t0 = min(starts) if starts else 0
    out: list[dict] = []
    slices: dict[tuple[int, int], dict] = {}   # (rank, instruction id) -> X event
    per_rank: dict[int, list[dict]] = {}
    for p in payloads:
        rank = p["rank"]
        pid = rank + 1       # pid 0 is special in some viewers
        off = offsets[(p["host"], p["pid"])]
        events = [_event(t) for t in p["events"]]
        per_rank[rank] = events
        rows = _rows(events)
        tracks = sorted(set(rows.values()), key=lambda lr: (lane_order(lr[0]), lr[1]))
        tids = {track: i + 1 for i, track in enumerate(tracks)}
        label = f"rank {rank}" + (f" ({p['host']})" if len({q['host'] for q in payloads}) > 1 else "")
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rank}})
        for (lane, row), tid in tids.items():
            title = lane_title(lane) + (f" #{row + 1}" if row else "")
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": title}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        buffers = {int(k): v for k, v in p.get("buffers", {}).items()}
        task_names = {int(k): v for k, v in p.get("task_names", {}).items()}
        for e in events:
            args: dict[str, Any] = {"instruction": e["instruction_id"], "kind": e["kind"]}
            if e.get("task") is not None:
                args["task"] = e["task"]
                if task_names.get(e["task"]):
                    args["task_name"] = task_names[e["task"]]
            if e.get("buffers"):
                args["buffers"] = [f"B{b}" + (f" {buffers[b]}" if buffers.get(b) else "") for b in e["buffers"]]
            if e.get("bytes"):
                args["bytes"] = e["bytes"]
            if e.get("transfer") is not None:
                args["transfer"] = list(e["transfer"])
            if e.get("peer") is not None:
                args["to_rank"] = e["peer"]
            if e.get("deps"):
                args["deps"] = list(e["deps"])
            start = e["start_ns"] + off - t0
            dur = max(e["end_ns"] - e["start_ns"], 0)
            x = {"ph": "X", "name": _slice_name(e, buffers), "cat": e["kind"], "pid": pid,
                 "tid": tids[rows[id(e)]], "ts": round(start / 1000.0, 3), "dur": round(dur / 1000.0, 3), "args": args}
            out.append(x)
            slices[(rank, e["instruction_id"])] = x
    out.extend(_flows(per_rank, slices))
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"generator": "celeritas", "ranks": len(payloads),
                          "backend": payloads[0].get("backend", "") if payloads else "",
                          "devices_per_rank": payloads[0].get("devices", 0) if payloads else 0}}


def _flows(per_rank: Mapping[int, list[dict]], slices: Mapping[tuple[int, int], dict]) -> list[dict]:
    """Flow arrows (``s`` at the source slice's start, ``f`` bound to the target slice)."""
    out: list[dict] = []
    next_id = 1

    def arrow(src: dict, dst: dict, cat: str) -> None:
        nonlocal next_id
        fid = next_id
        next_id += 1
        out.append({"ph": "s", "id": fid, "name": cat, "cat": cat, "pid": src["pid"], "tid": src["tid"],
                    "ts": src["ts"]})
        # inside the target slice (bp "e" binds to the enclosing one), and not before the start
        # where possible: a receive is often posted before its send starts
        ts = min(max(dst["ts"], src["ts"]), dst["ts"] + dst["dur"])
        out.append({"ph": "f", "bp": "e", "id": fid, "name": cat, "cat": cat, "pid": dst["pid"],
                    "tid": dst["tid"], "ts": ts})

    for rank, events in per_rank.items():
        for e in events:
            if e["kind"] in _SYNC_KINDS:
                continue
            dst = slices[(rank, e["instruction_id"])]
            for d in e.get("deps") or ():
                src = slices.get((rank, d))
                if src is None or src["tid"] == dst["tid"] or src["cat"] in _SYNC_KINDS:
                    continue
                arrow(src, dst, "dependency")
    # a send to the first receive-like instruction of the same transfer on the target rank
    receivers: dict[tuple[int, tuple], dict] = {}
    for rank, events in per_rank.items():
        for e in sorted(events, key=lambda x: _RECEIVE_KINDS.index(x["kind"]) if x["kind"] in _RECEIVE_KINDS else 9):
            if e["kind"] in _RECEIVE_KINDS and e.get("transfer") is not None:
                receivers.setdefault((rank, tuple(e["transfer"])), slices[(rank, e["instruction_id"])])
    for rank, events in per_rank.items():
        for e in events:
            if e["kind"] == "send" and e.get("peer") is not None and e.get("transfer") is not None:
                dst = receivers.get((e["peer"], tuple(e["transfer"])))
                if dst is not None:
                    arrow(slices[(rank, e["instruction_id"])], dst, "transfer")
    return out


def write_trace(outputs) -> None:
    """``CELERITAS_TRACE`` at shutdown; collective over all ranks, rank 0 writes the file."""
    target = outputs.trace_file
    if not target:
        return
    rank = outputs.rank
    try:
        payload = trace_payload(outputs)
    except Exception:  # noqa: BLE001
        log.exception("rank %d: could not collect the execution trace", rank)
        payload = None
    try:
        parts = outputs.gather(payload)
    except Exception as exc:  # noqa: BLE001
        log.warning("rank %d: could not gather the execution trace (%s); writing this rank's only", rank, exc)
        parts = [payload]
        if rank != 0:
            p = Path(target)
            target = str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))
    if parts is None:
        return
    try:
        doc = build_trace(parts)
        path = Path(target)
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, separators=(",", ":")))
        log.info("execution trace written to %s (open it at https://ui.perfetto.dev, or draw it: "
                 "python -m celeritas trace %s -o timeline.png)", path, path)
    except Exception:  # noqa: BLE001
        log.exception("rank %d: could not write the execution trace to %s", rank, target)
