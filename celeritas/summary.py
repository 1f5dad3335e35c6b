"""Shutdown summary: what ran, how much moved, where time went, and whether the executor starved.

Printed on rank 0 at shutdown when ``CELERITAS_SUMMARY=1`` or the log level is ``info``
or ``debug``.  The numbers come from the scheduler's counters and the executor trace
(which the runtime turns on for the summary); ``summary_numbers`` returns them as a dict.

Executor starvation is the time the executor had nothing in flight on any lane while
the scheduler was busy compiling, or held commands back for lookahead (Celerity counts a
scheduler waiting to flush as busy too): the executor waited for instructions, not for
data.
The runtime has the scheduler record its busy intervals (``scheduler.busy_intervals``)
whenever the executor traces, so this is the exact overlap of the executor's idle gaps
with them.  Without intervals (a runtime built by hand) only the total busy time
(``scheduler.busy_ns``) is known and starvation is estimated as min(idle, busy), an
upper bound, marked as an estimate.
"""
from __future__ import annotations

import logging
from collections import Counter, defaultdict
from typing import Iterable, Mapping, Sequence

from .graphs import fmt_bytes
from .trace import lane_order, lane_title

log = logging.getLogger("celeritas.graphs")

STARVATION_WARNING = 0.20


def enabled(config) -> bool:
    """Whether the runtime configured by ``config`` prints the summary at shutdown."""
    return bool(getattr(config, "summary", False)) or getattr(config, "log_level", "warning") in ("info", "debug")


def _union(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for a, b in sorted(intervals):
        if b < a:
            a, b = b, a
        if merged and a <= merged[-1][1]:
            if b > merged[-1][1]:
                merged[-1][1] = b
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals: Iterable[tuple[int, int]]) -> int:
    return sum(b - a for a, b in intervals)


def _gaps(busy: Sequence[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    out = []
    cur = lo
    for a, b in busy:
        if a > cur:
            out.append((cur, min(a, hi)))
        cur = max(cur, b)
    if cur < hi:
        out.append((cur, hi))
    return [(a, b) for a, b in out if b > a]


def _overlap(xs: Sequence[tuple[int, int]], ys: Sequence[tuple[int, int]]) -> int:
    """Total length of the intersection of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0
    while i < len(xs) and j < len(ys):
        a = max(xs[i][0], ys[j][0])
        b = min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def rank_numbers(outputs) -> dict:
    """This rank's numbers (``outputs``: a ``celeritas.outputs.RankOutputs``); local."""
    events = list(outputs.trace)
    by_kind = dict(sorted(Counter(outputs.instruction_counts).items()))
    rec = outputs.records
    records = rec["instructions"] if rec is not None else []
    if not by_kind and records:
        by_kind = dict(sorted(Counter(r["kind"] for r in records).items()))
    task_records = rec["tasks"] if rec is not None else []
    tasks_by_kind = dict(sorted(Counter(t["kind"] for t in task_records).items())) if task_records else {}

    copied = sent = received = None
    if events:
        copied = sum(e.bytes for e in events if e.kind == "copy")
        sent = sum(e.bytes for e in events if e.kind == "send")
        received = sum(e.bytes for e in events if e.kind in ("receive", "split_receive", "gather_receive"))
    elif records:
        copied = sum(r.get("size_bytes", 0) for r in records if r["kind"] == "copy")
        sent = sum(r.get("size_bytes", 0) for r in records if r["kind"] == "send")
        received = sum(r.get("size_bytes", 0) for r in records if r["kind"] in ("receive", "split_receive"))

    lanes: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        lanes[e.lane].append((e.start_ns, e.end_ns))
    lane_busy = {lane: _length(_union(iv)) for lane, iv in sorted(lanes.items(), key=lambda kv: lane_order(kv[0]))}
    lane_count = {lane: len(iv) for lane, iv in lanes.items()}
    busy_all = _union(iv for lst in lanes.values() for iv in lst)
    if busy_all:
        lo, hi = busy_all[0][0], busy_all[-1][1]
    else:
        lo = hi = 0
    window = hi - lo
    idle = _gaps(busy_all, lo, hi)
    idle_ns = _length(idle)
    sched_busy = int(outputs.scheduler_busy_ns or 0)
    intervals = outputs.scheduler_busy_intervals
    if intervals is not None:
        starvation_ns = _overlap(idle, _union((a, b) for a, b in intervals))
        estimate = False
    else:
        starvation_ns = min(idle_ns, sched_busy)
        estimate = True
    return {
        "rank": outputs.rank,
        "tasks": int(outputs.num_tasks or len(task_records)),
        "tasks_by_kind": tasks_by_kind,
        "instructions": sum(by_kind.values()),
        "instructions_by_kind": by_kind,
        "executed": len(events),
        "bytes_copied": copied,
        "bytes_sent": sent,
        "bytes_received": received,
        "lanes": {lane: {"busy_ns": ns, "instructions": lane_count[lane],
                         "fraction": ns / window if window else 0.0} for lane, ns in lane_busy.items()},
        "window_ns": window,
        "idle_ns": idle_ns,
        "scheduler_busy_ns": sched_busy,
        "starvation_ns": starvation_ns,
        "starvation": starvation_ns / window if window else 0.0,
        "starvation_estimated": estimate,
        "traced": bool(events),
        "replay": {level: dict(v) for level, v in outputs.replay.items()},
        "memory": dict(outputs.memory),
        "throttled": outputs.throttled,
        "dry_run": bool(getattr(outputs, "dry_run", False)),
    }


def combine(per_rank: Iterable[Mapping | None]) -> dict:
    """All ranks' numbers in one dict: totals plus the per-rank entries."""
    ranks = sorted((dict(r) for r in per_rank if r is not None), key=lambda r: r["rank"])
    by_kind: Counter = Counter()
    for r in ranks:
        by_kind.update(r["instructions_by_kind"])

    def total(key: str) -> int | None:
        vals = [r[key] for r in ranks if r.get(key) is not None]
        return sum(vals) if vals else None

    worst = max(ranks, key=lambda r: r["starvation"], default=None)
    replay: dict[str, Counter] = {}
    memory: Counter = Counter()
    for r in ranks:
        for level, v in r.get("replay", {}).items():
            replay.setdefault(level, Counter()).update(v)
        memory.update(r.get("memory", {}))
    return {
        "ranks": len(ranks),
        "tasks": ranks[0]["tasks"] if ranks else 0,      # identical task stream on every rank
        "tasks_by_kind": ranks[0]["tasks_by_kind"] if ranks else {},
        "instructions": sum(r["instructions"] for r in ranks),
        "instructions_by_kind": dict(sorted(by_kind.items())),
        "bytes_copied": total("bytes_copied"),
        "bytes_sent": total("bytes_sent"),
        "bytes_received": total("bytes_received"),
        "starvation": worst["starvation"] if worst else 0.0,
        "starvation_rank": worst["rank"] if worst else None,
        "starvation_warning": bool(worst and worst["traced"] and worst["starvation"] > STARVATION_WARNING),
        "replay": {level: dict(v) for level, v in replay.items()},
        "memory": dict(memory),
        "throttled": max((r.get("throttled", 0) for r in ranks), default=0),
        "dry_run": any(r.get("dry_run") for r in ranks),
        "per_rank": ranks,
    }


def summary_numbers(outputs) -> dict | None:
    """The combined numbers on rank 0 (None on other ranks); collective over all ranks."""
    try:
        mine = rank_numbers(outputs)
    except Exception:  # noqa: BLE001 - still take part in the gather
        log.exception("rank %d: could not compute the summary", outputs.rank)
        mine = None
    parts = outputs.gather(mine)
    return combine(parts) if parts is not None else None


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f} ms"


def _table(title: str, **kw):
    """A rich table at least as wide as its title: rich wraps a title to the table's width,
    and the narrow tables here ("tasks | 4") would break a title over two lines."""
    from rich.table import Table
    return Table(title=title, title_justify="left", min_width=len(title), **kw)


def render(numbers: Mapping, console=None) -> None:
    """Print ``numbers`` (from ``summary_numbers``) as rich tables."""
    from rich.console import Console
    con = console or Console(stderr=True)
    ranks = numbers["per_rank"]

    def b(v) -> str:
        return "n/a" if v is None else fmt_bytes(v)

    over = _table(f"celeritas summary ({numbers['ranks']} rank{'s' if numbers['ranks'] != 1 else ''})",
                  show_header=False)
    over.add_column(style="bold")
    over.add_column(justify="right")
    tk = numbers["tasks_by_kind"]
    over.add_row("tasks", str(numbers["tasks"]) + (" (" + ", ".join(f"{k} {v}" for k, v in tk.items()) + ")" if tk else ""))
    over.add_row("instructions", str(numbers["instructions"]))
    over.add_row("bytes copied", b(numbers["bytes_copied"]))
    over.add_row("bytes sent", b(numbers["bytes_sent"]))
    for level in ("task", "command", "instruction"):
        rp = numbers.get("replay", {}).get(level)
        if rp:
            lowered = rp.get("misses", 0) + rp.get("bypassed", 0) + rp.get("first", 0)
            grouped = rp.get("grouped", 0)
            kinds = "".join(f", {n} {what}" for n, what in ((rp.get("grouped_reductions", 0), "with the task's reductions"),
                                                            (rp.get("grouped_gathers", 0), "gathering partial results"))
                            if n)
            together = f" ({grouped} of them a task's commands together{kinds})" if grouped else ""
            chained = rp.get("chained", 0)
            if chained:     # (found along a chain from a horizon, without a key: see replay chains)
                together += f", {chained} found along a chain"
            over.add_row(f"replay, {level} graph", f"{rp.get('hits', 0)} replayed{together}, {lowered} lowered "
                                                    f"({rp.get('templates', 0)} templates)")
    mem = numbers.get("memory", {})
    if mem.get("evictions") or mem.get("batches"):
        over.add_row("out of core", f"{mem.get('evictions', 0)} evictions ({b(mem.get('bytes_evicted'))}, "
                                    f"{b(mem.get('bytes_written_back'))} saved to host), "
                                    f"{mem.get('batches', 0)} batch kernels "
                                    f"({mem.get('batched_chunks', 0)} chunks larger than their device)")
    if numbers.get("throttled"):
        over.add_row("application thread", f"waited {numbers['throttled']}× for the executor to catch up "
                                           f"(max on one rank)")
    con.print(over)

    kinds = _table("instructions by kind")
    kinds.add_column("kind")
    for r in ranks:
        kinds.add_column(f"R{r['rank']}", justify="right")
    if len(ranks) > 1:
        kinds.add_column("total", justify="right", style="bold")
    for kind, n in numbers["instructions_by_kind"].items():
        row = [kind] + [str(r["instructions_by_kind"].get(kind, 0)) for r in ranks]
        if len(ranks) > 1:
            row.append(str(n))
        kinds.add_row(*row)
    con.print(kinds)

    if any(r["traced"] for r in ranks):
        lanes = _table("busy time per lane")
        for col in ("rank", "lane", "instructions", "busy", "of run"):
            lanes.add_column(col, justify="left" if col in ("rank", "lane") else "right")
        for r in ranks:
            for lane, v in r["lanes"].items():
                lanes.add_row(f"R{r['rank']}", lane_title(lane), str(v["instructions"]), _ms(v["busy_ns"]),
                              f"{100 * v['fraction']:.1f} %")
        con.print(lanes)
        st = _table("executor starvation")
        for col in ("rank", "run", "executor idle", "scheduler busy", "starved"):
            st.add_column(col, justify="left" if col == "rank" else "right")
        for r in ranks:
            frac = r["starvation"]
            style = "bold red" if frac > STARVATION_WARNING else ""
            st.add_row(f"R{r['rank']}", _ms(r["window_ns"]), _ms(r["idle_ns"]), _ms(r["scheduler_busy_ns"]),
                       f"[{style}]{100 * frac:.1f} %{' (est.)' if r['starvation_estimated'] else ''}[/]"
                       if style else f"{100 * frac:.1f} %{' (est.)' if r['starvation_estimated'] else ''}")
        con.print(st)
        if numbers["starvation_warning"]:
            worst = next(r for r in ranks if r["rank"] == numbers["starvation_rank"])
            up_to = "up to " if worst["starvation_estimated"] else ""
            con.print(f"[bold yellow]warning:[/] the executor of rank {numbers['starvation_rank']} had nothing "
                      f"to run for {up_to}{100 * numbers['starvation']:.0f} % of the run while the scheduler was busy: "
                      "instruction generation is the bottleneck (fewer, larger kernels; a coarser split; "
                      "lookahead 'none' if commands are held back)")
    elif numbers.get("dry_run"):
        con.print("[dim]no lane busy times or starvation: a dry run (CELERITAS_DRY_RUN_NODES) "
                  "executes nothing[/dim]")
    else:
        con.print("[dim]lane busy times and starvation need the execution trace\n"
                  "(CELERITAS_SUMMARY=1 or CELERITAS_TRACE turn it on)[/dim]")


def print_summary(outputs) -> None:
    """At shutdown (every rank calls it; rank 0 prints)."""
    if not outputs.summary:
        return
    try:
        numbers = summary_numbers(outputs)
    except Exception as exc:  # noqa: BLE001 - gather failed (cluster aborted)
        log.warning("rank %d: could not gather the summary (%s)", outputs.rank, exc)
        return
    if numbers is None or outputs.rank != 0:
        return
    try:
        render(numbers)
    except Exception:  # noqa: BLE001
        log.exception("could not print the summary")
