"""Graph records (``Queue.graphs()``) and the dumps written at shutdown."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("celeritas.graphs")


class GraphRecord(dict):
    """``{"tasks", "commands", "instructions", "pilots"}``; every record a plain JSON-able dict."""

    KEYS = ("tasks", "commands", "instructions", "pilots")

    @classmethod
    def collect(cls, runtime) -> "GraphRecord":
        sched = runtime.scheduler
        return cls(tasks=[dict(r) for r in runtime.task_manager.records],
                   commands={runtime.rank: [dict(r) for r in sched.cdag.records]},
                   instructions=[dict(r) for r in sched.igg.records],
                   pilots=[dict(r) for r in sched.igg.pilot_records])

    def to_json(self) -> str:
        return json.dumps({"tasks": self["tasks"],
                           "commands": {str(k): v for k, v in self["commands"].items()},
                           "instructions": self["instructions"], "pilots": self["pilots"]})


def write_outputs(runtime) -> None:
    """Graph dumps (CELERITAS_PRINT_GRAPHS) at shutdown."""
    folder = runtime.config.print_graphs
    if not folder:
        return
    rec = GraphRecord.collect(runtime)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    r = runtime.rank
    if r == 0:
        (out / "tasks.json").write_text(json.dumps(rec["tasks"]))
    (out / f"commands-rank{r}.json").write_text(json.dumps(rec["commands"][r]))
    (out / f"instructions-rank{r}.json").write_text(json.dumps({"instructions": rec["instructions"],
                                                                 "pilots": rec["pilots"]}))
