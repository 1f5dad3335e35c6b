"""Graph records (``Queue.graphs()``), their Graphviz rendering, and the dumps written at shutdown.

Distributed programs are debugged by looking at them: which tasks depend on which, how
each rank split them into commands and transfers, and what every rank's instruction
graph asks the executor to do.  The records are plain JSON-able dicts (docs/api.md,
"Graph records"); everything here is a pure function of them, so a dump read back with
``GraphRecord.from_json`` renders exactly like the live record.

At shutdown (``CELERITAS_PRINT_GRAPHS=DIR``) rank 0 writes the task graph and the command
graphs of all ranks merged into one picture (gathered over a cloned communicator), and
every rank writes its own instruction graph; ``python -m celeritas graphs DIR`` turns the
``.dot`` files into SVGs.
"""
from __future__ import annotations

import html
import json
import logging
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping

from scheduler.errors import CeleritasError, ConfigError

log = logging.getLogger("celeritas.graphs")

TASK_GRAPH = "task_graph"
COMMAND_GRAPH = "command_graph"
INSTRUCTION_GRAPH = "instruction_graph_rank{rank}"

# ---------------------------------------------------------------------------------------------
# styles (Celerity's conventions, so people who know those pictures can read these)

_FONT = "Helvetica"
_RANK_COLORS = ("black", "crimson", "dodgerblue4", "goldenrod", "maroon4", "springgreen4", "tan3",
                "chartreuse4")

# task kind -> (shape, colour)
_TASK_STYLE = {
    "device_compute": ("box", "darkorange2"),
    "host_compute": ("box", "goldenrod3"),
    "collective": ("box", "darkred"),
    "master_node": ("box", "goldenrod3"),
    "fence": ("box", "darkorange"),
    "horizon": ("ellipse", "gray40"),
    "epoch": ("ellipse", "black"),
}
_TASK_KIND_TEXT = {"device_compute": "device-compute", "host_compute": "host-compute",
                   "collective": "collective host", "master_node": "master-node host"}

# command kind -> (shape, colour)
_COMMAND_STYLE = {
    "execution": ("box", "darkorange2"),
    "push": ("box", "deeppink2"),
    "await_push": ("box", "deeppink2"),
    "reduction": ("box", "blue"),
    "fence": ("box", "darkorange"),
    "horizon": ("ellipse", "gray40"),
    "epoch": ("ellipse", "black"),
}

# instruction kind -> (shape, colour)
_INSTRUCTION_STYLE = {
    "alloc": ("ellipse", "cyan3"),
    "free": ("ellipse", "cyan3"),
    "copy": ("ellipse", "green3"),
    "device_kernel": ("box", "darkorange2"),
    "host_task": ("box", "darkorange2"),
    "send": ("box", "deeppink2"),
    "receive": ("box", "deeppink2"),
    "split_receive": ("box", "deeppink2"),
    "await_receive": ("box", "deeppink2"),
    "gather_receive": ("box", "deeppink2"),
    "fill_identity": ("ellipse", "blue"),
    "reduce": ("ellipse", "blue"),
    "fence": ("box", "darkorange"),
    "destroy_host_object": ("ellipse", "black"),
    "clone_collective_group": ("ellipse", "darkred"),
    "horizon": ("box", "gray40"),
    "epoch": ("box", "black"),
}

# dependency origin -> edge attributes (task and command graphs; anti dependencies win)
_DEP_ORIGIN_STYLE = {
    "collective_group_serialization": {"color": "blue"},
    "execution_front": {"color": "orange"},
    "last_epoch": {"color": "orchid"},
    "side_effect": {"color": "goldenrod3"},
}
_ANTI_STYLE = {"color": "limegreen", "style": "dashed"}

# instruction dependency origin -> edge attributes
_INSTR_DEP_STYLE = {
    "allocation_lifetime": {"color": "cyan3"},
    "write": {"color": "limegreen", "style": "dashed"},
    "read": {},
    "side_effect": {"color": "goldenrod3"},
    "collective_order": {"color": "blue"},
    "last_epoch": {"color": "orchid"},
    "execution_front": {"color": "orange"},
    "split_receive": {"color": "gray"},
}

_PILOT_COLOR = "#606060"
_TRANSFER_COLOR = "deeppink2"

_MEMORY_NAMES = {0: "user", 1: "host"}


# ---------------------------------------------------------------------------------------------
# the record


class GraphRecord(dict):
    """``{"tasks", "commands", "instructions", "pilots"}``; every record a plain JSON-able dict.

    ``commands`` maps rank (int) to that rank's command records.  The ``to_dot_*``
    methods take the buffer names separately because records hold buffer ids only.
    """

    KEYS = ("tasks", "commands", "instructions", "pilots")

    def __init__(self, tasks: Iterable[dict] = (), commands: Mapping[int, list] | None = None,
                 instructions: Iterable[dict] = (), pilots: Iterable[dict] = ()):
        super().__init__(tasks=list(tasks), commands={int(k): list(v) for k, v in (commands or {}).items()},
                         instructions=list(instructions), pilots=list(pilots))

    @classmethod
    def from_recorders(cls, recorders, rank: int) -> "GraphRecord":
        """A rank's records (tasks, its own commands, instructions and pilots), copied from
        its ``scheduler.recorders.Recorders``."""
        return cls(tasks=[dict(r) for r in recorders.tasks.tasks],
                   commands={rank: [dict(r) for r in recorders.commands.commands]},
                   instructions=[dict(r) for r in recorders.instructions.instructions],
                   pilots=[dict(r) for r in recorders.instructions.pilots])

    @classmethod
    def merge(cls, records: Iterable[Mapping]) -> "GraphRecord":
        """One record with the commands of all ``records`` (the task list of the first).

        Each rank may come from one record only: two records holding commands of one rank
        (two runs' dumps, or one file given twice) would otherwise lose one of them.
        """
        records = list(records)
        commands: dict[int, list] = {}
        for r in records:
            for rank, cmds in r["commands"].items():
                if int(rank) in commands:
                    raise CeleritasError(f"GraphRecord.merge: two records hold the commands of rank {int(rank)}; "
                                         f"merge one record per rank (of one run)")
                commands[int(rank)] = list(cmds)
        first = records[0] if records else {"tasks": [], "instructions": [], "pilots": []}
        return cls(tasks=first["tasks"], commands=dict(sorted(commands.items())),
                   instructions=first["instructions"], pilots=first["pilots"])

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps({"tasks": self["tasks"],
                           "commands": {str(k): v for k, v in self["commands"].items()},
                           "instructions": self["instructions"], "pilots": self["pilots"]}, indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> "GraphRecord":
        """Inverse of ``to_json``: rank keys become ints again.

        The text usually comes from a file (a dump's ``.json``), so anything that is not a
        graph record is a ``ConfigError`` (a ``ValueError`` too) saying what is wrong with
        it, before a renderer trips over it."""
        try:
            data = json.loads(text)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"not a celeritas graph record: the text is not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"not a celeritas graph record: a JSON {type(data).__name__}, not an object with "
                              f"{', '.join(cls.KEYS)}")
        missing = [k for k in cls.KEYS if k not in data]
        if missing:
            raise ConfigError(f"not a celeritas graph record: missing {', '.join(missing)}")
        for key, id_key in (("tasks", "id"), ("instructions", "id"), ("pilots", "msg_id")):
            _check_entries(data[key], key, id_key)
        if not isinstance(data["commands"], dict):
            raise ConfigError(f"not a celeritas graph record: 'commands' is a {type(data['commands']).__name__}, "
                              f"not an object of rank: commands")
        for rank, cmds in data["commands"].items():
            if not str(rank).lstrip("-").isdigit():
                raise ConfigError(f"not a celeritas graph record: 'commands' has the key {rank!r}, not a rank")
            _check_entries(cmds, f"commands of rank {rank}", "id")
        return cls(**{k: data[k] for k in cls.KEYS})

    # ---- Graphviz --------------------------------------------------------------------------
    def to_dot_tasks(self, buffer_names: Mapping[int, str] | None = None, title: str | None = None) -> str:
        return task_graph_dot(self, buffer_names, title)

    def to_dot_commands(self, buffer_names: Mapping[int, str] | None = None, title: str | None = None) -> str:
        return command_graph_dot(self, buffer_names, title)

    def to_dot_instructions(self, buffer_names: Mapping[int, str] | None = None, title: str | None = None,
                            rank: int | None = None) -> str:
        return instruction_graph_dot(self, buffer_names, title, rank)


def _check_entries(entries: Any, what: str, id_key: str) -> None:
    """``entries`` is a list of objects with an integer ``id_key`` (and a ``kind``, but pilots
    have none): what every renderer indexes."""
    if not isinstance(entries, list):
        raise ConfigError(f"not a celeritas graph record: '{what}' is a {type(entries).__name__}, not a list")
    for n, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ConfigError(f"not a celeritas graph record: entry {n} of '{what}' is a {type(e).__name__}, "
                              f"not an object")
        if not isinstance(e.get(id_key), int):
            raise ConfigError(f"not a celeritas graph record: entry {n} of '{what}' has no integer {id_key!r}")
        if id_key == "id" and not isinstance(e.get("kind"), str):
            raise ConfigError(f"not a celeritas graph record: entry {n} of '{what}' has no 'kind'")


# ---------------------------------------------------------------------------------------------
# label helpers


# Characters no picture can show: C0 and C1 controls, DEL, lone surrogates (from JSON's
# "\ud800") and the XML non-characters.  Graphviz's HTML labels and SVG are XML, where
# most of these are not allowed at all (dot refuses the file: "not well-formed"), and a
# newline in an HTML label is plain whitespace, so a name's line break would vanish.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_SHOWN_AS = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def visible_text(text: Any) -> str:
    """``str(text)`` with the characters no picture can show written as escapes (``\\n``,
    ``\\x01``, ``\\ud800``), so that names from users never break a DOT, SVG or HTML file
    and stay recognisable.  The records keep the names as given."""
    def show(m: re.Match) -> str:
        c = m.group()
        return _SHOWN_AS.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
    return _INVISIBLE.sub(show, str(text))


def _esc(text: Any) -> str:
    return html.escape(visible_text(text), quote=True)


def fmt_box(box) -> str:
    """``[[min...], [max...]]`` as slices, e.g. ``[0:4, 8:16]`` (``[]`` for 0-d)."""
    if box is None:
        return "?"
    lo, hi = box
    return "[" + ", ".join(f"{a}:{b}" for a, b in zip(lo, hi)) + "]"


def fmt_region(region) -> str:
    if region is None:
        return "?"
    if not region:
        return "(empty)"
    if len(region) == 1:
        return fmt_box(region[0])
    return "{" + ", ".join(fmt_box(b) for b in region) + "}"


def _buffer_label(bid: int | None, names: Mapping[int, str]) -> str:
    if bid is None:
        return "scratch"
    name = names.get(bid) or names.get(str(bid))  # type: ignore[call-overload]
    return f"B{bid}" + (f' "{name}"' if name else "")


def _transfer_label(transfer) -> str:
    if transfer is None:
        return "?"
    t, b, r = transfer
    return f"T{t}.B{b}" + (f".R{r}" if r else "")


def _memory_label(m: int | None) -> str:
    if m is None:
        return "M?"
    return f"M{m} " + _MEMORY_NAMES.get(m, f"D{m - 2}")


def _task_title(t: Mapping | None, tid: int) -> str:
    if t is None:
        return f"T{tid}"
    return f"T{tid}" + (f' "{t["name"]}"' if t.get("name") else "")


def _attrs(attrs: Mapping[str, Any]) -> str:
    parts = []
    for k, v in attrs.items():
        if v is None or v == "":
            continue
        if k == "label":
            parts.append(f"label=<{v}>")
        else:
            parts.append(f'{k}="{_dq(v)}"')
    return ", ".join(parts)


def _dq(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"')


def _dep_style(kind: str, origin: str) -> dict:
    """Task and command dependencies: anti in green dashes, pseudo-dependencies by origin."""
    if kind == "anti":
        style = dict(_ANTI_STYLE)
    else:
        style = dict(_DEP_ORIGIN_STYLE.get(origin, {}))
    style["tooltip"] = f"{kind} dependency ({origin})"
    style["class"] = f"dep {kind} {origin}"
    return style


def _instr_dep_style(origin: str) -> dict:
    style = dict(_INSTR_DEP_STYLE.get(origin, {}))
    style["tooltip"] = f"dependency ({origin})"
    style["class"] = f"dep {origin}"
    return style


def _legend(items: Iterable[tuple[str, str]]) -> str:
    return " &#183; ".join(f'<font color="{c}">{_esc(t)}</font>' for t, c in items)


def _preamble(name: str, title: str, legend: str) -> list[str]:
    label = f"<b>{_esc(title)}</b>" + (f'<br/><font point-size="9">{legend}</font>' if legend else "")
    return [f'digraph "{_dq(name)}" {{',
            f'  graph [label=<{label}>, labelloc="t", fontname="{_FONT}", pad="0.2", newrank="true"];',
            f'  node [fontname="{_FONT}", fontsize="10"];',
            f'  edge [fontname="{_FONT}", fontsize="9"];']


def _unrecorded(node: str, label: str) -> str:
    """A stand-in for a dependency target the record does not hold (recording began after
    it ran, ``Queue(record=True)`` made mid-run): the edge stays, so no node looks as if it
    depended on nothing."""
    attrs = {"shape": "box", "style": "dashed", "color": "gray60", "fontcolor": "gray40", "class": "unrecorded",
             "tooltip": "before the recording began", "label": f"{label}<br/><i>not recorded</i>"}
    return f"  {node} [{_attrs(attrs)}];"


_DEP_LEGEND = _legend([("true", "black"), ("anti", "limegreen"), ("execution front", "orange"),
                       ("last epoch", "orchid"), ("collective order", "blue"), ("side effect", "goldenrod3")])


# ---------------------------------------------------------------------------------------------
# task graph


def _access_lines(accesses: Iterable[Mapping], names: Mapping[int, str], with_region: bool = True) -> list[str]:
    out = []
    for a in accesses:
        line = f"<i>{_esc(a.get('mode', ''))}</i> {_esc(_buffer_label(a.get('buffer'), names))}"
        if with_region and a.get("region") is not None:
            line += f" {_esc(fmt_region(a['region']))}"
        out.append(line)
    return out


def _task_label(t: Mapping, names: Mapping[int, str]) -> str:
    kind = t["kind"]
    lines = [_esc(_task_title(t, t["id"]))]
    head = f"<b>{_esc(_TASK_KIND_TEXT.get(kind, kind))}</b>"
    if kind in ("device_compute", "host_compute", "collective") and t.get("range"):
        off = t.get("offset") or [0] * len(t["range"])
        head += " " + _esc(fmt_box([off, [o + r for o, r in zip(off, t["range"])]]))
    if kind == "epoch" and t.get("action") not in (None, "none"):
        head += f" ({_esc(t['action'])})"
    if t.get("collective_group") is not None:
        head += f" in CG{t['collective_group']}"
    lines.append(head)
    for r in t.get("reductions", ()):
        lines.append(f"(R{r['id']}) <i>reduce</i> {_esc(_buffer_label(r['buffer'], names))}")
    lines.extend(_access_lines(t.get("accesses", ()), names))
    for h in t.get("side_effects", ()):
        lines.append(f"<i>affect</i> H{h}")
    return "<br/>".join(lines)


def task_graph_dot(record: Mapping, buffer_names: Mapping[int, str] | None = None,
                   title: str | None = None) -> str:
    """The task graph: one node per task, one edge per task dependency (to a dashed stand-in
    where the task depended on is not recorded)."""
    names = buffer_names or {}
    tasks = record["tasks"]
    ids = {t["id"] for t in tasks}
    out = _preamble(TASK_GRAPH, title or "Task graph", _DEP_LEGEND)
    for t in tasks:
        shape, color = _TASK_STYLE.get(t["kind"], ("box", "black"))
        out.append(f'  T{t["id"]} [{_attrs({"shape": shape, "style": "rounded" if shape == "box" else "", "color": color, "class": t["kind"], "label": _task_label(t, names)})}];')
    for tid in sorted({d["id"] for t in tasks for d in t.get("deps", ())} - ids):
        out.append(_unrecorded(f"T{tid}", f"T{tid}"))
    for t in tasks:
        for d in t.get("deps", ()):
            out.append(f'  T{d["id"]} -> T{t["id"]} [{_attrs(_dep_style(d["kind"], d["origin"]))}];')
    out.append("}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# command graph (all ranks in one picture)


def _command_label(c: Mapping, rank: int, tasks: Mapping[int, Mapping], names: Mapping[int, str]) -> str:
    kind = c["kind"]
    lines = [f"C{c['id']} on R{rank}"]
    task = tasks.get(c.get("task"))
    if kind == "execution":
        box = c.get("box")
        lines.append("<b>execution</b>" + (f" {_esc(fmt_box(box))}" if box and box[0] else ""))
        if task is not None:
            lines.extend(_access_lines(task.get("accesses", ()), names, with_region=False))
    elif kind == "push":
        tr = c.get("transfer")
        lines.append(f"<b>push</b> {_esc(_transfer_label(tr))}")
        bl = _esc(_buffer_label(tr[1] if tr else None, names))
        for tgt in c.get("targets", ()):
            lines.append(f"to R{tgt['rank']}: {bl} {_esc(fmt_region(tgt.get('region')))}")
    elif kind == "await_push":
        tr = c.get("transfer")
        lines.append(f"<b>await push</b> {_esc(_transfer_label(tr))}")
        lines.append(f"{_esc(_buffer_label(tr[1] if tr else None, names))} {_esc(fmt_region(c.get('region')))}")
    elif kind == "reduction":
        lines.append(f"<b>reduction</b> R{c.get('reduction')}")
        lines.append(_esc(_buffer_label(c.get("buffer"), names)))
    elif kind == "epoch":
        action = task.get("action") if task else None
        lines.append("<b>epoch</b>" + (f" ({_esc(action)})" if action not in (None, "none") else ""))
    else:
        lines.append(f"<b>{_esc(kind)}</b>")
    return "<br/>".join(lines)


def command_graph_dot(record: Mapping, buffer_names: Mapping[int, str] | None = None,
                      title: str | None = None) -> str:
    """Every rank's commands, grouped by task; font colour says the rank.

    Dependency edges stay within a rank.  Dashed pink edges (class ``transfer``, not
    dependencies) join each push to the await-push of the same transfer on the target rank.
    """
    names = buffer_names or {}
    tasks = {t["id"]: t for t in record["tasks"]}
    commands = {int(r): cmds for r, cmds in record["commands"].items()}
    ranks = sorted(commands)
    legend = _DEP_LEGEND + " &#183; " + _legend([("push \u2192 await push", _TRANSFER_COLOR)])
    legend += "<br/>" + _legend([(f"R{r}", _RANK_COLORS[r % len(_RANK_COLORS)]) for r in ranks])
    out = _preamble(COMMAND_GRAPH, title or f"Command graph ({len(ranks)} rank{'s' if len(ranks) != 1 else ''})",
                    legend)
    by_task: dict[int, list[str]] = defaultdict(list)
    loose: list[str] = []
    for r in ranks:
        font = _RANK_COLORS[r % len(_RANK_COLORS)]
        for c in commands[r]:
            shape, color = _COMMAND_STYLE.get(c["kind"], ("box", "black"))
            node = (f'R{r}_C{c["id"]} [{_attrs({"shape": shape, "color": color, "fontcolor": font, "class": c["kind"], "label": _command_label(c, r, tasks, names)})}];')
            if c.get("task") is not None:
                by_task[c["task"]].append(node)
            else:
                loose.append(node)
    for tid in sorted(by_task):
        t = tasks.get(tid)
        kind = _TASK_KIND_TEXT.get(t["kind"], t["kind"]) if t else "task"
        label = f'<font color="#606060">{_esc(_task_title(t, tid))} ({_esc(kind)})</font>'
        out.append(f'  subgraph cluster_T{tid} {{')
        out.append(f'    graph [label=<{label}>, color="darkgray", style="rounded"];')
        out.extend("    " + n for n in by_task[tid])
        out.append("  }")
    out.extend("  " + n for n in loose)
    for r in ranks:
        ids = {c["id"] for c in commands[r]}
        for cid in sorted({d["id"] for c in commands[r] for d in c.get("deps", ())} - ids):
            out.append(_unrecorded(f"R{r}_C{cid}", f"C{cid} on R{r}"))
        for c in commands[r]:
            for d in c.get("deps", ()):
                out.append(f'  R{r}_C{d["id"]} -> R{r}_C{c["id"]} [{_attrs(_dep_style(d["kind"], d["origin"]))}];')
    # pushes to the matching await-push on the receiving rank
    awaits = {}
    for r in ranks:
        for c in commands[r]:
            if c["kind"] == "await_push" and c.get("transfer") is not None:
                awaits[(r, tuple(c["transfer"]))] = c["id"]
    for r in ranks:
        for c in commands[r]:
            if c["kind"] != "push" or c.get("transfer") is None:
                continue
            for tgt in c.get("targets", ()):
                a = awaits.get((tgt["rank"], tuple(c["transfer"])))
                if a is not None:
                    attrs = {"style": "dashed", "color": _TRANSFER_COLOR, "class": "transfer",
                             "tooltip": f"transfer {_transfer_label(c['transfer'])} R{r} to R{tgt['rank']}"}
                    out.append(f'  R{r}_C{c["id"]} -> R{tgt["rank"]}_C{a} [{_attrs(attrs)}];')
    out.append("}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# instruction graph (one rank)


def _instruction_label(i: Mapping, tasks: Mapping[int, Mapping], allocs: Mapping[int, Mapping],
                       names: Mapping[int, str]) -> str:
    kind = i["kind"]
    iid = i["id"]

    def task_ref(tid) -> str:
        return _esc(_task_title(tasks.get(tid), tid)) if tid is not None else "?"

    def alloc_ref(aid) -> str:
        a = allocs.get(aid)
        return f"A{aid}" + (f" ({_esc(_memory_label(a.get('memory')))})" if a else "")

    lines: list[str] = []
    if kind == "alloc":
        lines.append(f"I{iid}")
        lines.append(f"<b>alloc</b> A{i.get('allocation')} on {_esc(_memory_label(i.get('memory')))}")
        if i.get("buffer") is not None:
            lines.append(f"for {_esc(_buffer_label(i['buffer'], names))} {_esc(fmt_box(i.get('box')))}")
        else:
            lines.append("scratch")
        lines.append(f"{fmt_bytes(i.get('size_bytes', 0))}")
    elif kind == "free":
        aid = i.get("allocation")
        lines.append(f"I{iid}")
        lines.append(f"<b>free</b> {alloc_ref(aid)}")
        a = allocs.get(aid)
        if a is not None:
            what = (f"{_esc(_buffer_label(a['buffer'], names))} {_esc(fmt_box(a.get('box')))}"
                    if a.get("buffer") is not None else "scratch")
            lines.append(f"{what}, {fmt_bytes(a.get('size_bytes', 0))}")
    elif kind == "copy":
        lines.append(f"I{iid}")
        head = "<b>evicting copy</b>" if i.get("evict") else "<b>copy</b>"
        lines.append(f"{head} {_esc(_buffer_label(i.get('buffer'), names))} {_esc(fmt_box(i.get('box')))}")
        lines.append(f"from A{i.get('source')} ({_esc(_memory_label(i.get('source_memory')))})")
        lines.append(f"to A{i.get('dest')} ({_esc(_memory_label(i.get('dest_memory')))})")
        lines.append(f"{_esc(i.get('layout', ''))}, {fmt_bytes(i.get('size_bytes', 0))}")
    elif kind in ("device_kernel", "host_task"):
        what = "device kernel" if kind == "device_kernel" else "host task"
        lines.append(f"I{iid} ({task_ref(i.get('task'))})")
        head = f"<b>{what}</b>"
        if i.get("name"):
            head += f" {_esc(i['name'])}"
        lines.append(head)
        where = f"on D{i.get('device')}" if kind == "device_kernel" else "on host"
        if i.get("batch"):
            k, n = i["batch"]
            where = f"batch {k + 1} of {n} " + where
        if i.get("collective_group") is not None:
            where += f" in CG{i['collective_group']}"
        box = i.get("box")
        lines.append(where + (f" {_esc(fmt_box(box))}" if box and box[0] else ""))
        for a in i.get("accesses", ()):
            lines.append(f"+ <i>{_esc(a.get('mode', ''))}</i> {_esc(_buffer_label(a.get('buffer'), names))} "
                         f"{_esc(fmt_box(a.get('box')))} via {alloc_ref(a.get('allocation'))}")
        for r in i.get("reductions", ()):
            start = "its value" if r.get("include_current") else "the identity"
            lines.append(f"+ <i>reduce</i> R{r.get('reduction')} {_esc(_buffer_label(r.get('buffer'), names))} "
                         f"into {alloc_ref(r.get('allocation'))} from {start}")
    elif kind == "send":
        tr = i.get("transfer")
        lines.append(f"I{iid}")
        lines.append(f"<b>send</b> {_esc(_transfer_label(tr))}")
        lines.append(f"to R{i.get('to')} MSG{i.get('msg_id')}")
        lines.append(f"{_esc(_buffer_label(tr[1] if tr else None, names))} {_esc(fmt_box(i.get('box')))}")
        if i.get("source") is not None:
            lines.append(f"from {alloc_ref(i['source'])}")
        lines.append(fmt_bytes(i.get("size_bytes", 0)))
    elif kind in ("receive", "split_receive", "await_receive"):
        tr = i.get("transfer")
        lines.append(f"I{iid}")
        lines.append(f"<b>{kind.replace('_', ' ')}</b> {_esc(_transfer_label(tr))}")
        lines.append(f"{_esc(_buffer_label(tr[1] if tr else None, names))} {_esc(fmt_region(i.get('region')))}")
        if i.get("dest") is not None:
            lines.append(f"into {alloc_ref(i['dest'])}")
        if i.get("size_bytes"):
            lines.append(fmt_bytes(i["size_bytes"]))
    elif kind == "gather_receive":
        tr = i.get("transfer")
        lines.append(f"I{iid}")
        lines.append(f"<b>gather receive</b> {_esc(_transfer_label(tr))}")
        lines.append(f"{_esc(_buffer_label(tr[1] if tr else None, names))}, {fmt_bytes(i.get('chunk_bytes', 0))} per rank")
    elif kind in ("fill_identity", "reduce"):
        lines.append(f"I{iid}")
        lines.append(f"<b>{kind.replace('_', ' ')}</b> R{i.get('reduction')} x{i.get('count')}")
    elif kind == "fence":
        tid = i.get("task")
        lines.append(f"I{iid} ({task_ref(tid)})")
        lines.append("<b>fence</b>")
        t = tasks.get(tid)
        if t is not None:
            lines.extend(_access_lines(t.get("accesses", ()), names))
            for h in t.get("side_effects", ()):
                lines.append(f"H{h}")
    elif kind == "destroy_host_object":
        lines.append(f"I{iid}")
        lines.append(f"<b>destroy</b> H{i.get('host_object')}")
    elif kind == "clone_collective_group":
        lines.append(f"I{iid}")
        lines.append(f"<b>clone collective group</b> CG{i.get('original')} &#8594; CG{i.get('new')}")
    elif kind in ("horizon", "epoch"):
        lines.append(f"I{iid} ({task_ref(i.get('task'))})")
        head = f"<b>{kind}</b>"
        if kind == "epoch" and i.get("action") not in (None, "none"):
            head += f" ({_esc(i['action'])})"
        lines.append(head)
    else:
        lines.append(f"I{iid}")
        lines.append(f"<b>{_esc(kind)}</b>")
    return "<br/>".join(lines)


def instruction_graph_dot(record: Mapping, buffer_names: Mapping[int, str] | None = None,
                          title: str | None = None, rank: int | None = None) -> str:
    """One rank's instructions, one edge per dependency; pilots beside their sends.

    Pilot nodes (``P<msg>``) are joined to their send by an undirected dashed edge of
    class ``pilot``; that edge is not a dependency.
    """
    names = buffer_names or {}
    tasks = {t["id"]: t for t in record["tasks"]}
    instrs = record["instructions"]
    if rank is None:
        cmd_ranks = [int(r) for r in record["commands"]]
        rank = cmd_ranks[0] if len(cmd_ranks) == 1 else None
    allocs = {i["allocation"]: i for i in instrs if i["kind"] == "alloc"}
    ids = {i["id"] for i in instrs}
    legend = _legend([("read (true)", "black"), ("write (anti/output)", "limegreen"),
                      ("allocation lifetime", "cyan3"), ("execution front", "orange"), ("last epoch", "orchid"),
                      ("collective order", "blue"), ("side effect", "goldenrod3"),
                      ("split receive", "gray"), ("pilot", _PILOT_COLOR)])
    name = INSTRUCTION_GRAPH.format(rank=rank if rank is not None else "")
    out = _preamble(name, title or ("Instruction graph" + (f" of rank {rank}" if rank is not None else "")),
                    legend)
    sends: dict[int, int] = {}
    for i in instrs:
        shape, color = _INSTRUCTION_STYLE.get(i["kind"], ("box", "black"))
        attrs = {"shape": shape, "style": "rounded" if shape == "box" else "", "color": color,
                 "class": i["kind"], "label": _instruction_label(i, tasks, allocs, names)}
        if i["kind"] in ("send", "receive", "split_receive", "await_receive", "gather_receive"):
            attrs["penwidth"] = "1.5"
        out.append(f'  I{i["id"]} [{_attrs(attrs)}];')
        if i["kind"] == "send":
            sends[i.get("msg_id")] = i["id"]
    for iid in sorted({d["id"] for i in instrs for d in i.get("deps", ())} - ids):
        out.append(_unrecorded(f"I{iid}", f"I{iid}"))
    for i in instrs:
        for d in i.get("deps", ()):
            out.append(f'  I{d["id"]} -> I{i["id"]} [{_attrs(_instr_dep_style(d.get("origin", "")))}];')
    for p in record.get("pilots", ()):
        msg = p["msg_id"]
        tr = p.get("transfer")
        label = (f'<font color="{_PILOT_COLOR}"><b>pilot</b> to R{p.get("to")} MSG{msg}<br/>'
                 f'{_esc(_transfer_label(tr))}<br/>{_esc(_buffer_label(tr[1] if tr else None, names))} '
                 f'{_esc(fmt_box(p.get("box")))}</font>')
        out.append(f'  P{msg} [{_attrs({"shape": "cds", "margin": "0.2,0.08", "color": _PILOT_COLOR, "class": "pilot", "label": label})}];')
        send = sends.get(msg)
        if send is not None:
            # an invisible cluster keeps the two side by side (rank=same alone lets mincross part them)
            out.append(f'  subgraph cluster_pilot_{msg} {{ graph [style="invis", margin="0"]; '
                       f'{{ rank=same; I{send}; P{msg}; }} }}')
            out.append(f'  P{msg} -> I{send} [{_attrs({"dir": "none", "style": "dashed", "color": _PILOT_COLOR, "class": "pilot", "tooltip": f"pilot of MSG{msg}"})}];')
    out.append("}")
    return "\n".join(out) + "\n"


def fmt_bytes(n: int | None) -> str:
    """A size as people read it: a byte count under 1 KiB, else binary units with one decimal
    (``120.6 KiB``).  The one spelling of sizes in graph labels, the summary and the timeline."""
    n = int(n or 0)
    if n < 1024:
        return f"{n} bytes"
    value = n / 1024
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        if round(value, 1) < 1024:      # (1023.96 KiB would print as 1024.0 KiB)
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


# ---------------------------------------------------------------------------------------------
# shutdown dump


def write_graphs(folder: str | Path, record: GraphRecord, buffer_names: Mapping[int, str] | None = None, *,
                 rank: int = 0, merged_commands: GraphRecord | None = None) -> list[Path]:
    """Write this rank's instruction graph, and (``merged_commands`` given) task and command graphs.

    Every ``.json`` beside a ``.dot`` is a ``GraphRecord``: the task graph's holds the tasks,
    the command graph's all ranks' commands (and the tasks), a rank's instruction graph's that
    rank's whole record.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    names = dict(buffer_names or {})
    written: list[Path] = []

    def put(stem: str, dot: str, rec: GraphRecord) -> None:
        # a picture rendered from an earlier run's .dot would pass for this run's
        (out / f"{stem}.svg").unlink(missing_ok=True)
        (out / f"{stem}.dot").write_text(dot)
        (out / f"{stem}.json").write_text(rec.to_json())
        written.extend((out / f"{stem}.dot", out / f"{stem}.json"))

    if merged_commands is not None:
        tasks_only = GraphRecord(tasks=merged_commands["tasks"])
        put(TASK_GRAPH, tasks_only.to_dot_tasks(names), tasks_only)
        cmds = GraphRecord(tasks=merged_commands["tasks"], commands=merged_commands["commands"])
        put(COMMAND_GRAPH, cmds.to_dot_commands(names), cmds)
    put(INSTRUCTION_GRAPH.format(rank=rank), record.to_dot_instructions(names, rank=rank), record)
    return written


_RANK_GRAPH_FILE = re.compile(r"instruction_graph_rank(\d+)\.(dot|json|svg)")


def remove_stale_rank_graphs(folder: str | Path, num_ranks: int) -> list[Path]:
    """Remove the instruction graphs of ranks >= ``num_ranks`` from ``folder``: a dump folder
    reused by a run with fewer ranks would otherwise mix two runs (and ``python -m
    celeritas graphs`` render both).  Only the files a dump or its rendering writes go."""
    removed = []
    for p in Path(folder).iterdir():
        m = _RANK_GRAPH_FILE.fullmatch(p.name)
        if m and int(m.group(1)) >= num_ranks and p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    if removed:
        log.info("removed %d graph files of ranks >= %d left from an earlier run in %s", len(removed), num_ranks,
                 folder)
    return removed


def write_outputs(outputs) -> None:
    """Graph dumps (``CELERITAS_PRINT_GRAPHS``) at shutdown: every rank writes its instruction
    graph, rank 0 also the task graph and all ranks' command graphs merged (gathered);
    collective over all ranks.  ``outputs`` is a ``celeritas.outputs.RankOutputs``."""
    folder = outputs.print_graphs
    if not folder:
        return
    rank = outputs.rank
    rec: GraphRecord | None = outputs.records
    names = dict(outputs.buffer_names)
    payload = None if rec is None else {"commands": rec["commands"], "buffers": names}
    try:
        parts = outputs.gather(payload)
    except Exception as exc:  # noqa: BLE001 - e.g. the cluster was aborted
        log.warning("rank %d: could not gather the command graphs (%s); writing this rank's only", rank, exc)
        parts = [payload] if rank == 0 else None
    if rec is None:
        return
    try:
        merged = None
        if rank == 0 and parts is not None:
            all_names = dict(names)
            commands: dict[int, list] = {}
            for p in parts:
                if p is None:
                    continue
                for bid, n in p["buffers"].items():
                    all_names.setdefault(int(bid), n)
                commands.update({int(r): c for r, c in p["commands"].items()})
            names = all_names
            merged = GraphRecord(tasks=rec["tasks"], commands=dict(sorted(commands.items())))
        write_graphs(folder, rec, names, rank=rank, merged_commands=merged)
        if rank == 0:
            remove_stale_rank_graphs(folder, 1 if outputs.dry_run else outputs.num_ranks)
            log.info("graphs written to %s (render them: python -m celeritas graphs %s)", folder, folder)
    except Exception:  # noqa: BLE001
        log.exception("rank %d: could not write the graphs to %s", rank, folder)
