"""Shared command-line plumbing of the apps."""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn

console = Console(stderr=True)


def base_parser(description: str, *, timed: bool = False) -> argparse.ArgumentParser:
    """The options every app takes; ``timed`` apps also print a JSON timing line and a step bar."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--devices", type=devices, default=None,
                   help="CELERITAS_DEVICES for this run (host:N, cuda, opencl, ...)")
    p.add_argument("--lookahead", default=None, choices=["none", "auto", "infinite"],
                   help="how far the scheduler looks ahead before it allocates (default: CELERITAS_LOOKAHEAD, auto)")
    p.add_argument("--verify", action="store_true", help="compare the result with a sequential numpy run")
    if timed:
        p.add_argument("--json", action="store_true", help="print one JSON timing line on stdout (rank 0)")
        p.add_argument("--no-progress", action="store_true", help="no step bar on stderr")
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
at_least = _at_least


def devices(text: str) -> str:
    """An argparse type: a ``CELERITAS_DEVICES`` value, checked when the options are parsed, so a
    typo is a usage error on every rank instead of a ConfigError traceback from ``cl.Queue``."""
    from celeritas.config import DeviceSpec
    from scheduler.errors import ConfigError
    try:
        DeviceSpec.parse(text, "--devices")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def finite_float(text: str) -> float:
    """An argparse type: a finite float (nan or inf would run and print nan, or never stop)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite float above zero."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def input_file(text: str) -> str:
    """An argparse type: a file that exists (checked before anything is computed)."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file" if Path(text).is_dir()
                                         else f"no such file: {text!r}")
    return text


def _writable_target(path: Path) -> str | None:
    """Why ``path`` cannot be created as a file (its missing folders are made), or None."""
    if path.is_dir():
        return f"{str(path)!r} is a folder; give a file name"
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{str(parent)!r} is a file, not a folder"
    if not os.access(path if path.exists() else parent, os.W_OK):
        return f"cannot write {str(path)!r} (no permission in {str(parent)!r})"
    return None


def image_output(text: str) -> str:
    """An argparse type: a picture file to write ('' for none), checked before the run, since
    rank 0 writes it in a host task after all the computation."""
    if not text:
        return text
    why = _writable_target(Path(text))
    if why:
        raise argparse.ArgumentTypeError(why)
    from PIL import Image
    Image.init()
    if Path(text).suffix.lower() not in Image.registered_extensions():
        raise argparse.ArgumentTypeError(f"{text!r} has no picture extension (.png, .jpg, ...)")
    return text


def output_folder(text: str) -> str:
    """An argparse type: a folder to write into (made if missing)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write into {text!r} (no permission in {str(parent)!r})")
    return text


def cli(main) -> int:
    """Run an app's ``main()`` as a command: a celeritas error, a run out of host memory or a
    file that cannot be read or written ends it with one line on stderr and exit status 1,
    not a traceback.  Under ``mpiexec`` with several ranks the line also ends the other ranks
    (which would wait for this one forever)."""
    from scheduler.errors import CeleritasError
    try:
        return main()
    except (CeleritasError, MemoryError, OSError) as exc:
        if isinstance(exc, MemoryError):
            what = f"out of host memory ({exc or 'MemoryError'}); try a smaller -N"
        elif isinstance(exc, CeleritasError):
            what = f"{type(exc).__name__}: {exc}"
        else:
            what = f"{exc.strerror or exc}: {exc.filename!r}" if exc.filename else str(exc)
        from executor.mpi import launched_under_mpi
        if launched_under_mpi():
            from executor.mpi.abort import abort_world
            abort_world(f"error: {what}")
        console.print(f"error: {what}", style="red", markup=False, highlight=False, soft_wrap=True)
        return 1


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
