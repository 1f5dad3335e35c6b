"""``python -m celeritas``: launch jobs, inspect the machine, draw graph dumps and execution traces.

    python -m celeritas run -n 4 [--devices host:2] script.py args…
    python -m celeritas run -n 2 -m apps.wave_sim -N 1024
    python -m celeritas run -n 2 -- python -m apps.wave_sim -N 1024
    python -m celeritas info
    python -m celeritas graphs DIR
    python -m celeritas trace TRACE.json -o timeline.png   (or .svg, .html)
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import os
import platform
import sys
from typing import Any, Sequence

from scheduler.errors import CeleritasError, ConfigError


def _console(stderr: bool = False):
    from rich.console import Console
    return Console(stderr=stderr, highlight=False)


# ---------------------------------------------------------------------------------- run


_RUN_VALUE_OPTIONS = {"-n", "--ranks", "--devices", "--mpiexec", "--mpiexec-arg"}
_RUN_FLAG_OPTIONS = {"--print", "-h", "--help"}


def split_run_argv(argv: Sequence[str]) -> tuple[list[str], str | None, bool, list[str]]:
    """Split ``run``'s arguments into (own options, target, is_module, program arguments).

    argparse cannot do this: the program's own options (``-N 1024``) would be
    taken for ``run``'s.  Everything after the first token that is not one of
    ``run``'s options belongs to the program; ``--`` ends the options
    explicitly.  A leading ``python``/``python3``/``sys.executable`` is dropped
    so that ``run -n 2 -- python -m apps.wave_sim`` works as people type it.
    """
    argv = list(argv)
    own: list[str] = []
    i = 0
    module = None
    while i < len(argv):
        a = argv[i]
        key = a.split("=", 1)[0]
        if a == "--":
            i += 1
            break
        if a in ("-m", "--module"):
            if i + 1 >= len(argv):
                raise ConfigError(f"run: {a} needs a module name")
            module = argv[i + 1]
            i += 2
            break
        if key == "--module" and "=" in a:
            module = a.split("=", 1)[1]
            i += 1
            break
        if key in _RUN_VALUE_OPTIONS:
            own.append(a)
            if "=" not in a:
                if i + 1 >= len(argv):
                    raise ConfigError(f"run: {a} needs a value")
                own.append(argv[i + 1])
                i += 1
            i += 1
            continue
        if a.startswith("-n") and a[2:].isdigit():
            own.append(a)
            i += 1
            continue
        if a in _RUN_FLAG_OPTIONS:
            own.append(a)
            i += 1
            continue
        if a.startswith("-"):
            raise ConfigError(f"run: unknown option {a!r} (options of the program go after the script or module)")
        break
    rest = argv[i:]
    if module is not None:
        return own, module, True, rest
    if rest and _is_python(rest[0]):
        rest = rest[1:]
        if rest[:1] == ["-m"]:
            if len(rest) < 2:
                raise ConfigError("run: python -m needs a module name")
            return own, rest[1], True, rest[2:]
    if not rest:
        return own, None, False, []
    return own, rest[0], False, rest[1:]


def _is_python(token: str) -> bool:
    import re
    return token == sys.executable or re.fullmatch(r"python[0-9.]*", os.path.basename(token)) is not None


def cmd_run(args: argparse.Namespace) -> int:
    from . import launcher
    rest = list(args.args)
    target = args.target
    if target is None:
        raise ConfigError("run: name a script (script.py) or a module (-m apps.wave_sim)")
    path = launcher.find_mpiexec(args.mpiexec)
    if path is not None and args.mpiexec:
        path = _executable(path, args.mpiexec)
    if path is None:
        if args.n != 1:
            raise ConfigError("no mpiexec found (next to the Python interpreter or on PATH); "
                              "pip install 'celeritas[mpi]' installs MPICH's")
        cmd = launcher.LaunchCommand([sys.executable] + (["-m", target] if args.module else [target]) + rest,
                                     dict(os.environ))
        if args.devices:
            cmd.env["CELERITAS_DEVICES"] = args.devices
    else:
        cmd = launcher.build_command(args.n, target, rest, mpiexec=launcher.detect(path), devices=args.devices,
                                     module=bool(args.module), extra=args.mpiexec_arg or ())
    if args.print_only:
        print(" ".join(_quote(a) for a in cmd.argv))
        return 0
    import subprocess
    try:
        return subprocess.run(cmd.argv, env=cmd.env).returncode
    except KeyboardInterrupt:
        return 130
    except OSError as exc:   # (not executable, vanished, ...): one line, not a traceback
        raise ConfigError(f"run: cannot start {cmd.argv[0]!r}: {exc.strerror or exc}") from None


def _executable(path: str, given: str) -> str:
    """``path`` (what ``--mpiexec given`` resolved to) as a program subprocess can start: an
    absolute path (a plain name that is no command on PATH but a file here would be looked
    up on PATH); ConfigError for a folder or a file that is not executable."""
    if os.path.isdir(path):
        raise ConfigError(f"--mpiexec {given!r} is a folder, not an mpiexec program")
    if not os.access(path, os.X_OK):
        raise ConfigError(f"--mpiexec {given!r} is not an executable mpiexec program (no execute permission)")
    return os.path.abspath(path)


def _quote(s: str) -> str:
    import shlex
    return shlex.quote(s)


# ---------------------------------------------------------------------------------- info


def huge_page_status(setting: int | None, mode: str | None) -> str:
    """One line for ``python -m celeritas info``: what ``CELERITAS_HUGE_PAGES`` (``setting``,
    as parsed) does under the kernel's THP ``mode``."""
    if setting is None:
        return f"off (CELERITAS_HUGE_PAGES=off); kernel THP mode: {mode or 'unknown'}"
    what = ("every host allocation" if setting == 0 else
            f"host allocations from {setting >> 20} MiB" if setting and setting % (1 << 20) == 0 else
            f"host allocations from {setting} bytes")
    if mode is None:
        return f"{what}: 2 MiB-aligned; no transparent huge pages on this system"
    if mode == "never":
        return f"{what}: 2 MiB-aligned, but the kernel's THP mode is never: all on 4 KiB pages"
    return f"{what}: 2 MiB-aligned, their whole 2 MiB pages huge (kernel THP mode: {mode})"


def _try(fn, *a, **kw) -> tuple[Any, str | None]:
    try:
        return fn(*a, **kw), None
    except Exception as exc:  # noqa: BLE001 - info reports, never fails
        return None, f"{type(exc).__name__}: {exc}"


def _cuda_devices() -> tuple[list[str], str | None]:
    try:
        import cupy
    except ImportError:
        return [], "CuPy not installed (pip install 'celeritas[cuda]')"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        return [], f"no usable CUDA runtime: {exc}"
    out = []
    for d in range(n):
        props = cupy.cuda.runtime.getDeviceProperties(d)
        name = props.get("name", b"?")
        name = name.decode() if isinstance(name, bytes) else str(name)
        out.append(f"cuda:{d} {name} ({props.get('totalGlobalMem', 0) / 2**30:.1f} GiB)")
    if out:
        from executor.backends.cuda_driver import CudaDriver
        out.append("source kernels and device copies enqueued through the CUDA driver (libcuda via ctypes, "
                   "keeping the GIL)" if CudaDriver.load() is not None else
                   "source kernels enqueued through CuPy (libcuda could not be bound through ctypes)")
    return out, None


def _opencl_devices() -> tuple[list[str], str | None]:
    try:
        import pyopencl as cl_
    except ImportError:
        return [], "PyOpenCL not installed (pip install 'celeritas[opencl]')"
    try:
        platforms = cl_.get_platforms()
    except Exception as exc:  # noqa: BLE001
        return [], f"no OpenCL platform: {exc}"
    out = []
    for p, plat in enumerate(platforms):
        for d, dev in enumerate(plat.get_devices()):
            out.append(f"opencl:{p}:{d} {dev.name.strip()} ({plat.name.strip()}, "
                       f"{dev.global_mem_size / 2**30:.1f} GiB)")
    return out, None


def _mpi_rows() -> list[tuple[str, Any]]:
    from rich.text import Text

    from . import launcher
    rows: list[tuple[str, Any]] = []
    try:
        import mpi4py
    except ImportError:
        rows.append(("mpi4py", Text("not installed (pip install 'celeritas[mpi]')", style="yellow")))
    else:
        rows.append(("mpi4py", mpi4py.__version__))
        from executor.mpi import mpi_info

        from .config import from_env
        info, err = _try(lambda: mpi_info(cuda_aware=from_env(warn=False).mpi_cuda_aware))
        if err:
            rows.append(("MPI library", Text(err, style="red")))
        else:
            rows.append(("MPI library", info["library"]))
            rows.append(("MPI standard", info["standard"]))
            level = info["thread_level"]
            ok = level == "MPI_THREAD_MULTIPLE"
            rows.append(("thread level", Text(level, style="green") if ok else
                         Text(f"{level} (celeritas needs MPI_THREAD_MULTIPLE)", style="red")))
            rows.append(("world size", str(info["world_size"])))
            aware = info.get("cuda_aware")
            rows.append(("CUDA-aware", {True: Text("yes: device buffers go to MPI directly", style="green"),
                                        False: "no: device data is staged through host memory",
                                        None: "unknown (set CELERITAS_MPI_CUDA_AWARE=1 if it is)"}[aware]))
    path, err = _try(launcher.find_mpiexec)
    if path:
        m = launcher.detect(path)
        rows.append(("mpiexec", Text(f"{path} ({m.flavor}{', ' + m.version if m.version else ''})")))
    else:
        rows.append(("mpiexec", Text(err or "not found", style="yellow")))
    return rows


def cmd_info(args: argparse.Namespace) -> int:
    from rich.table import Table
    from rich.text import Text
    import numpy as np

    from . import __version__
    console = _console()

    t = Table(title="celeritas", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("version", __version__)
    t.add_row("Python", Text(f"{platform.python_version()} ({sys.executable})"))
    t.add_row("numpy", np.__version__)
    t.add_row("platform", f"{platform.platform()}, {os.cpu_count()} CPU cores")
    from executor.backends.host import transparent_huge_pages

    from . import config
    cfg, err = _try(config.from_env, warn=False)   # (an invalid environment is reported at the end)
    unknown = config.unknown_variables()
    if err is None and unknown:
        err = "; ".join(config.describe_unknown(k, v) for k, v in unknown.items())
    t.add_row("huge pages", huge_page_status(config.HUGE_PAGES_DEFAULT if cfg is None else cfg.huge_pages,
                                             transparent_huge_pages()))
    from .runtime import host_allocator_status
    t.add_row("host allocator", host_allocator_status("tuned" if cfg is None else cfg.host_allocator))
    console.print(t)

    b = Table(title="backends and devices", title_justify="left")
    b.add_column("backend", style="bold")
    b.add_column("devices")
    b.add_row("host", "[green]available[/green]: CPU threads simulate N devices (CELERITAS_DEVICES=host:N)")
    for name, probe in (("cuda", _cuda_devices), ("opencl", _opencl_devices)):
        devs, why = probe()
        if devs:
            b.add_row(name, "\n".join(devs))
        else:
            b.add_row(name, Text(why or "no devices", style="yellow"))
    console.print(b)

    m = Table(title="MPI", show_header=False, title_justify="left")
    m.add_column(style="bold")
    m.add_column()
    for k, v in _mpi_rows():
        m.add_row(k, v)
    console.print(m)

    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("CELERITAS_")}
    c = Table(title="configuration (environment)", show_header=False, title_justify="left")
    c.add_column(style="bold")
    c.add_column()
    if env:
        for k, v in env.items():
            c.add_row(k, Text(v) if k not in unknown else
                      Text(f"{v}  (not a celeritas setting" + (f"; did you mean {unknown[k]}?)" if unknown[k] else ")"),
                           style="red"))
    else:
        c.add_row("CELERITAS_*", "(none set: defaults)")
    c.add_row("valid", Text("yes", style="green") if err is None else Text(err, style="red"))
    console.print(c)
    return 0 if err is None else 1


# ---------------------------------------------------------------------------------- graphs


INSTALL_HINT = """Graphviz's `dot` is not installed (or not on PATH). Install it with one of:
  Debian/Ubuntu:  sudo apt-get install graphviz
  Fedora/RHEL:    sudo dnf install graphviz
  macOS:          brew install graphviz
  conda:          conda install -c conda-forge graphviz
then run this command again."""


def render_folder(folder: str | Path, *, fmt: str = "svg", timeout: float | None = None,
                  console=None) -> int:
    """Render every ``.dot`` in ``folder`` with Graphviz; returns a process exit code.

    0: all rendered; 1: no ``dot``, nothing to render, or a render failed (an empty ``.dot``
    too); 2: no such folder, or a file given instead of one.
    """
    from rich.console import Console
    con = console or Console(stderr=True)
    path = Path(folder)
    if path.exists() and not path.is_dir():
        con.print(f"[red]{path} is a file, not a folder:[/red] give the folder CELERITAS_PRINT_GRAPHS wrote "
                  f"({path.parent})", highlight=False, soft_wrap=True)
        return 2
    if not path.is_dir():
        con.print(f"[red]no such folder:[/red] {path}", highlight=False, soft_wrap=True)
        return 2
    files = sorted(path.glob("*.dot"))
    if not files:
        con.print(f"[yellow]no .dot files in {path}[/yellow] (write some with CELERITAS_PRINT_GRAPHS={path})")
        return 1
    dot = shutil.which("dot")
    if dot is None:
        con.print(INSTALL_HINT, markup=False, style="red", highlight=False)
        return 1

    def render(f: Path) -> tuple[Path, str | None]:
        target = f.with_suffix("." + fmt)
        try:
            if not f.read_text(errors="replace").strip():
                # (dot exits 0 on an empty file and writes nothing: a run killed while dumping)
                return f, "the file is empty (no graph in it); dump it again"
        except OSError as exc:
            return f, f"cannot read it: {exc.strerror or exc}"
        try:
            proc = subprocess.run([dot, f"-T{fmt}", str(f), "-o", str(target)], capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return f, f"timed out after {timeout} s (graph too large? try fewer tasks or a smaller run)"
        if proc.returncode != 0:
            return f, (proc.stderr or proc.stdout).strip() or f"dot exited with {proc.returncode}"
        return target, None

    failures = 0
    with ThreadPoolExecutor(max_workers=min(8, len(files))) as pool:
        for result, err in pool.map(render, files):
            if err is None:
                con.print(f"[green]wrote[/green] {result}", highlight=False)
            else:
                failures += 1
                con.print(f"[red]failed[/red] {result}: {err}", highlight=False)
    return 1 if failures else 0


def cmd_graphs(args: argparse.Namespace) -> int:
    return render_folder(args.dir, console=_console(stderr=True))


# ---------------------------------------------------------------------------------- trace


def cmd_trace(args: argparse.Namespace) -> int:
    from . import timeline
    output = args.output or str(_default_output(args.trace))
    tl = timeline.render(args.trace, output, width=args.width)
    _console(stderr=True).print(
        f"[green]wrote[/green] {output}: {len(tl.ranks)} rank{'s' if len(tl.ranks) != 1 else ''}, "
        f"{len(tl.rows)} lanes, {tl.instructions} instructions, {len(tl.transfers)} transfers, "
        f"{tl.span / 1000:.3f} ms", highlight=False, soft_wrap=True)   # a path must stay copyable
    return 0


def _default_output(trace: str):
    from pathlib import Path
    p = Path(trace)
    name = p.name[:-len(".json.gz")] if p.name.endswith(".json.gz") else p.stem
    return p.with_name(name + ".html")


_GRAPHS_HELP = """\
Render the graph dumps of a run to pictures.

DIR is the folder a run wrote at shutdown with CELERITAS_PRINT_GRAPHS=DIR:
task_graph.dot/.json, command_graph.dot/.json (every rank's commands) and
instruction_graph_rank{R}.dot/.json (one per rank).  Every .dot file in DIR
is rendered with Graphviz's `dot` to an .svg beside it (task_graph.svg, ...);
the .json graph records are left as they are (cl.GraphRecord.from_json reads
them).  Needs Graphviz installed (apt-get install graphviz).

exit status: 0 all rendered; 1 no `dot`, no .dot file in DIR, or a render
failed (an empty .dot file too); 2 DIR does not exist or is not a folder.

example:
  CELERITAS_PRINT_GRAPHS=graphs python -m apps.hello
  python -m celeritas graphs graphs      # writes graphs/task_graph.svg, ...
"""

_TRACE_HELP = """\
Draw the execution timeline of a trace, without a browser.

TRACE is the Chrome trace-event file a run wrote at shutdown with
CELERITAS_TRACE=TRACE (the file Perfetto opens).  The picture has one row per
rank and executor lane, one bar per instruction coloured by its kind (legend
below the time axis, in ms), each lane's busy share in its label, and a line
from every send to the receive that takes its data on the other rank.  Bars
of one kind closer than a pixel are merged and show their count.

The output's extension picks the format: .png (needs Pillow), .svg, or a
self-contained .html (hover a bar or line for details, plus per-lane tables).

exit status: 0 written; 2 TRACE missing or not a trace, or an unknown output
extension.

example:
  CELERITAS_TRACE=trace.json python -m celeritas run -n 2 -m apps.wave_sim
  python -m celeritas trace trace.json -o timeline.png
"""


# ---------------------------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m celeritas", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a script on N ranks under mpiexec")
    r.add_argument("-n", "--ranks", dest="n", type=int, default=1, help="number of MPI ranks")
    r.add_argument("--devices", default=None, help="CELERITAS_DEVICES for every rank (host:N, cuda, opencl, …)")
    r.add_argument("-m", "--module", default=None,
                   help="run a module (python -m MODULE) instead of a script; what follows are its arguments")
    r.add_argument("--mpiexec", default=None, help="the mpiexec to use (default: next to Python, else PATH)")
    r.add_argument("--mpiexec-arg", action="append", help="extra argument for mpiexec (repeatable)")
    r.add_argument("--print", dest="print_only", action="store_true", help="print the command, do not run it")
    r.add_argument("target", nargs="?", default=None, help="script.py (or -- python script.py / python -m MODULE)")
    r.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    r.set_defaults(fn=cmd_run)

    i = sub.add_parser("info", help="backends, devices and MPI of this machine")
    i.set_defaults(fn=cmd_info)

    g = sub.add_parser("graphs", help="render the graph dumps in DIR (written by CELERITAS_PRINT_GRAPHS=DIR) to SVG",
                       description=_GRAPHS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("dir", metavar="DIR",
                   help="the folder CELERITAS_PRINT_GRAPHS wrote (its .dot files are rendered to .svg beside them)")
    g.set_defaults(fn=cmd_graphs)

    t = sub.add_parser("trace", help="draw the timeline of a CELERITAS_TRACE file as .png, .svg or .html",
                       description=_TRACE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("trace", metavar="TRACE", help="the .json trace file CELERITAS_TRACE wrote")
    t.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="timeline.png, timeline.svg or timeline.html (default: TRACE with .html)")
    t.add_argument("--width", type=int, default=1600, help="width of the picture in pixels (400 to 16384, default 1600)")
    t.set_defaults(fn=cmd_trace)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["run"]:
            own, target, is_module, rest = split_run_argv(argv[1:])
            args = parser().parse_args(["run", *own])
            args.target, args.args = target, rest
            args.module = target if is_module else None
        else:
            args = parser().parse_args(argv)
    except CeleritasError as exc:
        _console(stderr=True).print(f"error: {exc}", style="red", markup=False, soft_wrap=True)
        return 2
    try:
        return int(args.fn(args) or 0)
    except CeleritasError as exc:
        _console(stderr=True).print(f"error: {exc}", style="red", markup=False, soft_wrap=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
