"""Strong- and weak-scaling studies: launch an app on 1, 2, 4, ... ranks, write CSV and a plot.

    python -m cluster.scaling --app wave_sim --ranks 1,2,4 [--devices host:1] [--size 2048] [--steps 50]
                              [--weak] [--repeats 3] [--out scaling-results] [--launcher auto|mpiexec|srun]

Each point is a separate job: ``mpiexec -n R python -m cluster.run_app ...`` (the
``mpiexec`` beside the interpreter, else the one on PATH, with Open MPI's root and
oversubscription flags where it needs them), or ``srun -n R ...`` inside a Slurm
allocation (``SLURM_JOB_ID`` set, or ``--launcher srun``).  Rank 0 of every job
prints one JSON timing line; the harness keeps the median over ``--repeats``.

Apps with a hand-written mpi4py baseline (``workloads.Workload.handwritten``:
wave_sim, nbody, jacobi3d) are also run that way at every point, alternating with
the celeritas job (``--no-handwritten`` skips them): the CSV has one row per
implementation (``impl``: celeritas or mpi4py), and the plot draws the baseline's
speedup and efficiency dashed beside celeritas's, each against its own time on the
smallest rank count.

Strong scaling keeps the problem size; speedup is ``R0 * t(R0) / t(R)`` against the
smallest rank count ``R0`` and efficiency is speedup / R.  Weak scaling grows the
size with the rank count so that the work per rank stays constant (edge length
times R^(1/d) for an app whose work per step grows like size^d); efficiency is
``t(R0) / t(R)`` and the scaled speedup ``R * t(R0) / t(R)``.
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.table import Table

from apps._common import devices, positive, positive_float

from . import workloads

log = logging.getLogger("celeritas.apps")
console = Console(stderr=True)
ROOT = Path(__file__).resolve().parents[1]

CSV_FIELDS = ["app", "impl", "mode", "ranks", "devices", "backend", "size", "steps", "seconds", "seconds_min", "runs",
              "speedup", "efficiency", "ideal_speedup", "launcher", "host"]


class LaunchError(RuntimeError):
    """A job of the study failed or printed no timing line."""


parse_ranks = workloads.count_list("--ranks", "rank")


def choose_launcher(requested: str = "auto", env: dict | None = None) -> str:
    """``srun`` inside a Slurm job (or when asked), else ``mpiexec``."""
    env = os.environ if env is None else env
    if requested != "auto":
        return requested
    return "srun" if env.get("SLURM_JOB_ID") else "mpiexec"


def _child_env(devices: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if devices:
        env["CELERITAS_DEVICES"] = devices
    return env


def build_command(launcher: str, ranks: int, runner_args: Sequence[str], *, devices: str | None = None,
                  mpiexec: str | None = None, extra: Sequence[str] = (),
                  module: str = "cluster.run_app") -> tuple[list[str], dict[str, str]]:
    """argv and environment of one job running ``module`` (``cluster.run_app``, or
    ``cluster.workloads`` for a hand-written baseline) on ``ranks`` ranks."""
    env = _child_env(devices)
    if launcher == "srun":
        argv = ["srun", "-n", str(ranks), *extra, sys.executable, "-m", module, *runner_args]
        return argv, env
    if launcher != "mpiexec":
        raise LaunchError(f"unknown launcher {launcher!r}; use mpiexec or srun")
    from celeritas import launcher as cl_launcher
    path = cl_launcher.find_mpiexec(mpiexec)
    if path is None:
        if ranks == 1:
            return [sys.executable, "-m", module, *runner_args], env
        raise LaunchError("no mpiexec found beside the Python interpreter or on PATH "
                          "(pip install 'celeritas[mpi]' installs MPICH's)")
    cmd = cl_launcher.build_command(ranks, module, runner_args, mpiexec=cl_launcher.detect(path),
                                    devices=devices, module=True, extra=extra, env=env)
    return cmd.argv, cmd.env


def parse_timing(stdout: str) -> dict | None:
    """The last JSON object with a ``seconds`` field among the job's output lines."""
    found = None
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "seconds" in obj:
            found = obj
    return found


def run_point(app: str, ranks: int, size: int, steps: int, *, launcher: str = "mpiexec", devices: str | None = None,
              lookahead: str | None = None, mpiexec: str | None = None, extra: Sequence[str] = (),
              timeout: float = 600.0, handwritten: bool = False) -> dict:
    """Launch one job and return rank 0's timing record (``handwritten``: the app's mpi4py baseline)."""
    if handwritten:
        runner_args = ["--handwritten", app, "--size", str(size), "--steps", str(steps)]
        module = "cluster.workloads"
    else:
        runner_args = ["--app", app, "--size", str(size), "--steps", str(steps)]
        module = "cluster.run_app"
        if devices:
            runner_args += ["--devices", devices]
        if lookahead:
            runner_args += ["--lookahead", lookahead]
    argv, env = build_command(launcher, ranks, runner_args, devices=devices, mpiexec=mpiexec, extra=extra,
                              module=module)
    log.info("launching %s", " ".join(argv))
    # a session of its own, so that a timeout ends the launcher *and* every rank it started
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        raise LaunchError(f"{app} on {ranks} rank(s) did not finish within {timeout:g} s: {' '.join(argv)}") from exc
    timing = parse_timing(stdout)
    if proc.returncode != 0 or timing is None:
        tail = "\n".join((stdout + stderr).strip().splitlines()[-20:])
        raise LaunchError(f"{app} on {ranks} rank(s) failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}")
    return timing


def _kill_group(proc: subprocess.Popen) -> None:
    import signal
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.communicate(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue


def study(app: str, ranks: Sequence[int], *, size: int | None = None, steps: int | None = None, weak: bool = False,
          repeats: int = 1, launcher: str = "auto", devices: str | None = None, lookahead: str | None = None,
          mpiexec: str | None = None, extra: Sequence[str] = (), timeout: float = 600.0,
          progress: bool = True, handwritten: bool = True) -> list[dict]:
    """One row per rank count and implementation, with speedup and efficiency relative to the
    smallest rank count (``handwritten``: also the app's mpi4py baseline, where it has one,
    each of its jobs right after the celeritas job of the same point)."""
    w = workloads.get(app)
    base = w.size if size is None else size
    steps = w.steps if steps is None else steps
    kind = choose_launcher(launcher)
    impls = ["celeritas"] + (["mpi4py"] if handwritten and w.handwritten is not None else [])
    rows: list[dict] = []
    for r in ranks:
        n = w.weak_size(base, r / ranks[0]) if weak else base
        times: dict[str, list[float]] = {i: [] for i in impls}
        last: dict[str, dict] = {}
        for _ in range(repeats):
            for impl in impls:
                got = run_point(app, r, n, steps, launcher=kind, devices=devices, lookahead=lookahead,
                                mpiexec=mpiexec, extra=extra, timeout=timeout, handwritten=impl == "mpi4py")
                if int(got.get("ranks", r)) != r:
                    raise LaunchError(f"{app}: asked for {r} ranks, the job ran on {got.get('ranks')} "
                                      f"(is mpi4py built against this launcher's MPI?)")
                times[impl].append(float(got["seconds"]))
                last[impl] = got
        for impl in impls:
            if progress:
                console.print(f"  {app} ({impl}) on {r} rank(s), size {n}: {statistics.median(times[impl]):.3f} s",
                              soft_wrap=True)
            rows.append({"app": app, "impl": impl, "mode": "weak" if weak else "strong", "ranks": r,
                         "devices": last[impl].get("devices", ""), "backend": last[impl].get("backend", ""),
                         "size": n, "steps": steps, "seconds": statistics.median(times[impl]),
                         "seconds_min": min(times[impl]), "runs": len(times[impl]), "launcher": kind,
                         "host": platform.node()})
    add_speedup(rows)
    return rows


def add_speedup(rows: list[dict]) -> None:
    """Fill speedup, efficiency and the ideal speedup, per app and implementation, against its
    smallest rank count."""
    by_app: dict[tuple, list[dict]] = {}
    for row in rows:
        by_app.setdefault((row["app"], row.get("impl", "celeritas")), []).append(row)
    for group in by_app.values():
        ref = min(group, key=lambda r: r["ranks"])
        r0, t0 = ref["ranks"], ref["seconds"]
        for row in group:
            ratio = t0 / row["seconds"] if row["seconds"] > 0 else float("nan")
            if row["mode"] == "weak":
                row["efficiency"] = ratio
                row["speedup"] = row["ranks"] * ratio
            else:
                row["speedup"] = r0 * ratio
                row["efficiency"] = row["speedup"] / row["ranks"]
            row["ideal_speedup"] = row["ranks"]


def write_csv(rows: Sequence[dict], path: Path) -> Path:
    return workloads.write_csv(rows, path, CSV_FIELDS)


def read_csv(path: Path) -> list[dict]:
    with Path(path).open() as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["impl"] = row.get("impl") or "celeritas"      # (files written before there were baselines)
        for k in ("ranks", "size", "steps", "runs"):
            row[k] = int(row[k])
        for k in ("seconds", "seconds_min", "speedup", "efficiency", "ideal_speedup"):
            row[k] = float(row[k])
    return rows


def plot(rows: Sequence[dict], path: Path, title: str | None = None) -> Path:
    """Speedup and efficiency against the rank count, beside the ideal lines (PNG, Agg backend)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = rows[0]["mode"] if rows else "strong"
    fig, (ax_s, ax_e) = plt.subplots(1, 2, figsize=(10, 4.2))
    all_ranks = sorted({r["ranks"] for r in rows})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, app in enumerate(dict.fromkeys(r["app"] for r in rows)):
        for impl, style in (("celeritas", "o-"), ("mpi4py", "s--")):
            group = sorted((r for r in rows if r["app"] == app and r.get("impl", "celeritas") == impl),
                           key=lambda r: r["ranks"])
            if not group:
                continue
            xs = [r["ranks"] for r in group]
            label = f"{app} ({group[0]['size']}" + ("→" + str(group[-1]["size"]) if mode == "weak" else "") + ")"
            if impl != "celeritas":
                label += ", hand-written mpi4py"
            color = colors[k % len(colors)]
            ax_s.plot(xs, [r["speedup"] for r in group], style, color=color, label=label)
            ax_e.plot(xs, [r["efficiency"] for r in group], style, color=color, label=label)
    r0 = all_ranks[0] if all_ranks else 1
    ax_s.plot(all_ranks, all_ranks, "k--", lw=1, label="ideal")
    ax_e.plot(all_ranks, [1.0] * len(all_ranks), "k--", lw=1, label="ideal")
    for ax in (ax_s, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_ranks)
        ax.set_xticklabels([str(x) for x in all_ranks])
        ax.set_xlabel("ranks")
        ax.grid(True, alpha=0.3)
    ax_s.set_yscale("log", base=2)
    lowest = min([r["speedup"] for r in rows if r["speedup"] > 0] + [1.0])
    ticks = sorted(set(all_ranks) | {2.0 ** k for k in range(-10, 11)
                                     if all_ranks and lowest / 2 < 2.0 ** k <= all_ranks[-1]})
    ax_s.set_yticks(ticks)
    ax_s.set_yticklabels([f"{x:g}" for x in ticks])
    cores = os.cpu_count() or 1
    if rows and rows[0].get("launcher") == "mpiexec" and all_ranks and all_ranks[-1] > cores:
        for ax in (ax_s, ax_e):     # a local run beyond the core count: ranks share cores from here on
            ax.axvline(cores, color="grey", ls=":", lw=1)
        ax_e.annotate(f"{cores} cores", (cores, 0.02), textcoords="offset points", xytext=(4, 0), fontsize=8,
                      color="grey")
    ax_s.minorticks_off()
    ax_s.set_ylabel("scaled speedup" if mode == "weak" else f"speedup vs {r0} rank(s)")
    ax_e.set_ylabel("efficiency")
    ax_e.set_ylim(0, max(1.1, max((r["efficiency"] for r in rows), default=1.0) * 1.05))
    ax_s.legend(fontsize=8)
    dev = rows[0].get("devices", "") if rows else ""
    fig.suptitle(title or f"{mode} scaling on {rows[0]['host'] if rows else ''} "
                          f"({os.cpu_count()} cores), {dev} device(s)/rank, {rows[0]['launcher'] if rows else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_table(rows: Sequence[dict]) -> None:
    t = Table(title="scaling")
    for col in ("app", "impl", "mode", "ranks", "size", "seconds", "speedup", "efficiency"):
        t.add_column(col, justify="left" if col in ("app", "impl", "mode") else "right")
    for r in rows:
        t.add_row(r["app"], r.get("impl", "celeritas"), r["mode"], str(r["ranks"]), str(r["size"]),
                  f"{r['seconds']:.3f}", f"{r['speedup']:.2f}", f"{r['efficiency']:.2f}")
    console.print(t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--app", default="wave_sim",
                   help=f"one or more (comma-separated) of {', '.join(workloads.WORKLOADS)}")
    p.add_argument("--ranks", type=parse_ranks, default=[1, 2, 4])
    p.add_argument("--devices", type=devices, default=None, help="CELERITAS_DEVICES of every rank (host:N, cuda, ...)")
    p.add_argument("--size", type=positive, default=None, help="problem size (the base size with --weak)")
    p.add_argument("--steps", type=positive, default=None)
    p.add_argument("--weak", action="store_true", help="grow the size with the rank count")
    p.add_argument("--repeats", type=positive, default=1, help="jobs per point; the median is kept")
    p.add_argument("--lookahead", default=None, choices=["none", "auto", "infinite"])
    p.add_argument("--launcher", default="auto", choices=["auto", "mpiexec", "srun"])
    p.add_argument("--mpiexec", default=None, help="a specific mpiexec")
    p.add_argument("--launcher-args", default="", help="extra launcher arguments, e.g. '--gpus-per-task=1'")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds per job")
    p.add_argument("--no-handwritten", action="store_true",
                   help="skip the apps' hand-written mpi4py baselines (run beside celeritas by default)")
    p.add_argument("--out", default="scaling-results", help="folder for the CSV and the PNG")
    p.add_argument("--name", default=None, help="file name stem (default: APP_MODE)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    apps = workloads.app_list(p, args.app)
    mode = "weak" if args.weak else "strong"
    console.print(f"{mode} scaling of {', '.join(apps)} on ranks {args.ranks} via "
                  f"{choose_launcher(args.launcher)}", soft_wrap=True)
    rows: list[dict] = []
    try:
        for a in apps:
            rows += study(a, args.ranks, size=args.size, steps=args.steps, weak=args.weak, repeats=args.repeats,
                          launcher=args.launcher, devices=args.devices, lookahead=args.lookahead,
                          mpiexec=args.mpiexec, extra=args.launcher_args.split(), timeout=args.timeout,
                          handwritten=not args.no_handwritten)
    except LaunchError as exc:
        console.print(f"[red]{exc}[/red]", soft_wrap=True)
        return 1
    stem = args.name or f"{'_'.join(apps)}_{mode}"
    out = Path(args.out)
    csv_path = write_csv(rows, out / f"{stem}.csv")
    png_path = plot(rows, out / f"{stem}.png")
    print_table(rows)
    console.print(f"wrote {csv_path} and {png_path}", soft_wrap=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
