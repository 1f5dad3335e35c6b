"""What a rank leaves behind: graph dumps, the execution trace and the shutdown summary.

All three are collective at shutdown (every rank gathers its part to rank 0, which
writes or prints) and read the runtime through one small public view,
``RankOutputs``, that the runtime builds: its records, trace, counters and a
collective gather.  ``graphs``, ``trace`` and ``summary`` are pure functions of it, so
they can be tested on hand-made views and never reach into the runtime's internals.
Every failure is logged, never raised: a broken dump must not fail a finished
program, and every rank still takes part in each gather so that no rank hangs.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("celeritas.outputs")


@dataclass(slots=True)
class RankOutputs:
    """One rank's view for its outputs (``Runtime.outputs()``)."""

    rank: int
    num_ranks: int = 1
    dry_run: bool = False
    print_graphs: str | None = None        # CELERITAS_PRINT_GRAPHS folder
    trace_file: str | None = None          # CELERITAS_TRACE file
    summary: bool = False                  # print the summary (CELERITAS_SUMMARY or log level info/debug)
    records: Any = None                    # this rank's GraphRecord, or None when not recording
    buffer_names: dict[int, str] = field(default_factory=dict)
    trace: list = field(default_factory=list)          # the executor's TraceEvents
    instruction_counts: dict[str, int] = field(default_factory=dict)
    scheduler_busy_ns: int = 0
    scheduler_busy_intervals: list | None = None      # (start, end) ns per event, when recorded
    num_tasks: int = 0
    backend: str = ""
    num_devices: int = 0
    replay: dict[str, dict] = field(default_factory=dict)   # level -> replay counters
    memory: dict[str, int] = field(default_factory=dict)    # out-of-core counters
    throttled: int = 0                     # times the application thread waited for the executor
    gather: Callable[[Any], list | None] = lambda obj: [obj]   # collective: all ranks' obj on rank 0


def write_at_shutdown(outputs: RankOutputs) -> None:
    """Graph dumps, trace and summary, in that order on every rank (their gathers pair up)."""
    from . import graphs, summary, trace
    graphs.write_outputs(outputs)
    trace.write_trace(outputs)
    summary.print_summary(outputs)
