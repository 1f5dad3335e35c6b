"""Finding ``mpiexec`` and building the command line that starts a celeritas job.

The ``mpiexec`` next to the running interpreter comes first (a virtual
environment with the ``mpich`` wheel ships one that matches its mpi4py), then
the one on ``PATH``.  Open MPI refuses to run as root or to place more ranks
than cores unless told to; MPICH's Hydra needs neither flag and rejects them,
so the flavour is detected with ``mpiexec --version`` before adding them.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from scheduler.errors import ConfigError

OPENMPI = "openmpi"
MPICH = "mpich"
INTEL = "intel"
UNKNOWN = "unknown"

# what stands for Open MPI's --allow-run-as-root in the environment (the ranks need it too)
OPENMPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@dataclass(frozen=True, slots=True)
class Mpiexec:
    """A launcher found on this machine."""

    path: str
    flavor: str = UNKNOWN          # openmpi | mpich | intel | unknown
    version: str = ""              # first line of ``--version``


@dataclass(slots=True)
class LaunchCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)   # full environment for the child


def find_mpiexec(explicit: str | None = None) -> str | None:
    """``explicit``, else the interpreter's sibling ``mpiexec``, else ``mpiexec``/``mpirun`` on PATH."""
    if explicit:
        p = shutil.which(explicit) or (explicit if Path(explicit).exists() else None)
        if p is None:
            raise ConfigError(f"mpiexec {explicit!r} not found")
        return str(p)
    sibling = Path(sys.executable).with_name("mpiexec")
    if sibling.exists() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which("mpiexec") or shutil.which("mpirun")


def classify_version_text(text: str) -> str:
    """The MPI flavour from ``mpiexec --version`` output."""
    t = text.lower()
    if "open mpi" in t or "openrte" in t or "open-mpi" in t or "prte" in t:
        return OPENMPI
    if "intel(r) mpi" in t or "intel mpi" in t:
        return INTEL
    if "hydra" in t or "mpich" in t:
        return MPICH
    return UNKNOWN


def detect(path: str, timeout: float = 15.0) -> Mpiexec:
    """Run ``path --version`` (bounded) and classify it."""
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout)
        text = (r.stdout or "") + (r.stderr or "")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Mpiexec(path, UNKNOWN, f"? ({exc})")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    flavor = classify_version_text(text)
    if flavor == MPICH:
        for ln in text.splitlines():
            if ln.strip().lower().startswith("version:"):
                first = "HYDRA " + ln.split(":", 1)[1].strip()
                break
    return Mpiexec(path, flavor, first)


def build_command(n: int, target: str, args: Sequence[str] = (), *, mpiexec: Mpiexec,
                  devices: str | None = None, module: bool = False, python: str | None = None,
                  extra: Sequence[str] = (), env: dict[str, str] | None = None,
                  is_root: bool | None = None, cores: int | None = None) -> LaunchCommand:
    """The ``mpiexec`` command line (and child environment) that runs ``target`` on ``n`` ranks."""
    if n < 1:
        raise ConfigError(f"-n must be at least 1, got {n}")
    child_env = dict(os.environ if env is None else env)
    if devices:
        from .config import DeviceSpec
        DeviceSpec.parse(devices, "--devices")          # fail here, not in every rank
        child_env["CELERITAS_DEVICES"] = devices
    argv = [mpiexec.path, "-n", str(n)]
    if mpiexec.flavor == OPENMPI:
        if is_root is None:
            is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        if cores is None:
            cores = os.cpu_count() or 1
        if is_root:
            argv.append("--allow-run-as-root")
            for k, v in OPENMPI_ROOT_ENV.items():
                child_env.setdefault(k, v)
        if n > cores:
            argv.append("--oversubscribe")
        for var in sorted(k for k in child_env if k.startswith("CELERITAS_")):
            argv += ["-x", var]               # Open MPI forwards only what it is told to
    argv += list(extra)
    argv.append(python or sys.executable)
    if module:
        argv += ["-m", target]
    else:
        argv.append(target)
    argv += list(args)
    return LaunchCommand(argv, child_env)


def run(n: int, target: str, args: Sequence[str] = (), *, devices: str | None = None, module: bool = False,
        mpiexec: str | None = None, extra: Sequence[str] = (), timeout: float | None = None) -> int:
    """Launch and wait; returns the job's exit status."""
    path = find_mpiexec(mpiexec)
    if path is None:
        if n == 1:
            env = dict(os.environ)
            if devices:
                env["CELERITAS_DEVICES"] = devices
            argv = [sys.executable] + (["-m", target] if module else [target]) + list(args)
            return subprocess.run(argv, env=env, timeout=timeout).returncode
        raise ConfigError("no mpiexec found (next to the Python interpreter or on PATH); "
                          "pip install 'celeritas[mpi]' installs MPICH's")
    cmd = build_command(n, target, args, mpiexec=detect(path), devices=devices, module=module, extra=extra)
    return subprocess.run(cmd.argv, env=cmd.env, timeout=timeout).returncode
