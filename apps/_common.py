"""Shared command-line plumbing of the apps."""
from __future__ import annotations

import argparse
import json
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn

console = Console(stderr=True)


def base_parser(description: str, *, timed: bool = False) -> argparse.ArgumentParser:
    """The options every app takes; ``timed`` apps also print a JSON timing line and a step bar."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--devices", default=None, help="CELERITAS_DEVICES for this run (host:N, cuda, opencl, ...)")
    p.add_argument("--lookahead", default=None, choices=["none", "auto", "infinite"])
    p.add_argument("--verify", action="store_true", help="compare the result with a sequential numpy run")
    if timed:
        p.add_argument("--json", action="store_true", help="print one JSON timing line on stdout (rank 0)")
        p.add_argument("--no-progress", action="store_true")
    return p


def _at_least(minimum: int):
    """An argparse type: an integer of at least ``minimum``.  Sizes and step counts use it, so
    a negative or zero size is a usage error, not a numpy traceback or a silent empty run."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


positive = _at_least(1)
nonnegative = _at_least(0)


def print_timing(app: str, ranks: int, devices: int, size: int, steps: int, seconds: float, **extra) -> None:
    """The ``--json`` line for job scripts: the fields of cluster/run_app.py's records, which
    ``cluster.scaling.parse_timing`` also finds among other output."""
    print(json.dumps({"app": app, "ranks": ranks, "devices": devices, "size": size, "steps": steps,
                      "seconds": seconds, **extra}), flush=True)


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0


def progress_bar(enabled: bool, *extra: ProgressColumn) -> Progress:
    """A step bar on stderr; disabled bars cost nothing, so every rank but 0 gets one.

    ``extra`` columns (e.g. a residual) go between the count and the elapsed time.
    """
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *extra,
                    TimeElapsedColumn(), console=console, disable=not enabled)


def report_verification(ok: bool, rank: int, detail: str = "", against: str = "numpy") -> int:
    """Print the --verify verdict on rank 0; the exit status every rank returns (1 on mismatch)."""
    if rank == 0:
        if ok:
            console.print(f"[green]verified against {against}[/green]")
        else:
            console.print(f"[red]mismatch{': ' + detail if detail else ''}[/red]")
    return 0 if ok else 1
