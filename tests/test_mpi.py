"""celeritas under a real ``mpiexec``: results, graphs, failures, divergence, the CLI.

Every job runs the scripts in ``tests/mpi_scripts`` with the ``mpiexec`` next to
the interpreter, ``CELERITAS_DEVICES=host:1`` or ``host:2`` per rank, and a
timeout; a job that outlives it is killed as a whole process group.  Launcher
and detection helpers are tested without MPI at the bottom.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jobs

from scheduler.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "mpi_scripts"
MPIEXEC = Path(sys.executable).with_name("mpiexec")

try:
    import mpi4py  # noqa: F401
    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False

needs_mpi = pytest.mark.skipif(not (MPIEXEC.exists() and HAVE_MPI4PY),
                               reason=f"needs mpi4py and {MPIEXEC}")


def _env(devices: str, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERITAS_")}
    env["CELERITAS_DEVICES"] = devices
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra or {})
    return env


def run_job(argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run ``argv`` from the repository root in its own session (see ``jobs.run_job``)."""
    return jobs.run_job(argv, env, timeout, cwd=ROOT)


def mpirun(n: int, script: str, *args: str, devices: str = "host:1", env: dict | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess:
    argv = [str(MPIEXEC), "-n", str(n), sys.executable, str(SCRIPTS / script), *args]
    return run_job(argv, _env(devices, env), timeout)


def _explain(r: subprocess.CompletedProcess) -> str:
    return f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr[-6000:]}"


def _every_rank_ok(r: subprocess.CompletedProcess, ranks: int) -> None:
    """The job exited cleanly and each of its ``ranks`` ranks printed ``rank R: ok``."""
    assert r.returncode == 0, _explain(r)
    for k in range(ranks):
        assert f"rank {k}: ok" in r.stdout, _explain(r)


# ------------------------------------------------------------------------------- apps


@pytest.fixture(scope="module")
def single_rank_apps(tmp_path_factory):
    out = tmp_path_factory.mktemp("apps") / "single.npz"
    r = run_job([sys.executable, str(SCRIPTS / "apps_check.py"), str(out)], _env("host:1"), 120)
    assert r.returncode == 0, _explain(r)
    assert "rank 0/1 SingleRankCommunicator ok" in r.stdout
    return dict(np.load(out))


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("ranks,devices,transfers", [(2, "host:2", "auto"), (4, "host:1", "auto"),
                                                     (2, "host:2", "direct")])
def test_apps_equal_single_rank_exactly(single_rank_apps, tmp_path, ranks, devices, transfers):
    """``direct``: MPI sends from and receives into device allocations (the CUDA-aware path)."""
    out = tmp_path / "mpi.npz"
    r = mpirun(ranks, "apps_check.py", str(out), devices=devices,
               env={"CELERITAS_MPI_DEVICE_MEMORY": transfers})
    assert r.returncode == 0, _explain(r)
    for k in range(ranks):
        assert f"rank {k}/{ranks} MpiCommunicator ok" in r.stdout, _explain(r)
    got = dict(np.load(out))
    assert set(got) == set(single_rank_apps)
    for name, want in single_rank_apps.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert np.array_equal(got[name], want), f"{name} differs from the single-rank result"


APP_CLI = {
    "hello": [],
    "wave_sim": ["-N", "40", "-T", "6"],
    "matmul": ["-N", "36"],
    "convolution": ["-N", "37", "-T", "2", "--no-progress"],
    "reduction": ["-N", "33", "-T", "2", "--no-progress"],
    "nbody": ["-N", "48", "-T", "3", "--no-progress"],
    "jacobi3d": ["-N", "14", "-T", "20", "--no-progress"],
    "rsim": ["-N", "21", "-T", "9", "--no-progress"],
}


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("app", sorted(APP_CLI))
def test_every_app_verifies_through_its_cli_under_mpiexec(app, ranks, tmp_path):
    """``python -m apps.X --verify`` exits 0 only if the result equals its numpy reference."""
    argv = [str(MPIEXEC), "-n", str(ranks), sys.executable, "-m", f"apps.{app}", "--verify", *APP_CLI[app]]
    if app == "convolution":
        argv += ["--output", str(tmp_path / "out.png")]
    r = run_job(argv, _env("host:1"), 120)
    assert r.returncode == 0, _explain(r)
    assert "verified" in r.stdout + r.stderr, _explain(r)


# ------------------------------------------------------------------------------- random programs


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("ranks,devices,first,count,window,replayed,limit",
                         [(2, "host:2", 0, 80, None, False, None), (4, "host:1", 1000, 80, None, False, None),
                          (3, "host:2", 2000, 60, 1, False, None), (2, "host:2", 3000, 30, None, True, None),
                          (2, "host:2", 4000, 30, None, True, "48K"), (2, "cuda:0,0", 5000, 30, None, True, None)])
def test_random_programs_match_numpy(ranks, devices, first, count, window, replayed, limit):
    """Random programs on several ranks equal numpy; one batch with a pilot window of 1
    (``MpiCommunicator.send_pilot``), so most pilots wait and most payloads go out of turn;
    one with loops four times longer and replay builders compiled at a template's first
    replay, so that steps replay through compiled builders; the same with bounded device
    memories (evictions, and a task's commands replayed together under a key that holds
    the memories' state), both reaching steps replayed together with a reduction of their
    own and with the gathering of an earlier one; and the same on the CUDA backend over the CuPy stand-in (its
    memory is bounded; the executor keeps the completions it enqueues, items of 300 µs
    outlast the host's work so that the waiters notify the rest)."""
    env = {"CELERITAS_HORIZON_STEP": "2", "CELERITAS_DIAGNOSTICS": "off"}
    if window is not None:
        env["FUZZ_PILOT_WINDOW"] = str(window)
    if replayed:
        env.update(FUZZ_REPEAT="4", FUZZ_COMPILE_AFTER="1")
    if limit is not None:
        env["CELERITAS_DEVICE_MEMORY_LIMIT"] = limit
    cuda = devices.startswith("cuda")
    if cuda:
        env["FUZZ_CUDA_STAND_IN"] = "300"
    r = mpirun(ranks, "fuzz_programs.py", str(first), str(count), devices=devices, env=env)
    assert r.returncode == 0, _explain(r)
    for k in range(ranks):
        assert f"rank {k}: {count}/{count} programs match numpy" in r.stdout, _explain(r)
        assert f"on {'cuda' if cuda else 'host'}" in r.stdout, _explain(r)
    if limit is not None or cuda:
        together = [int(m) for m in re.findall(r"(\d+) of a task's commands together", r.stdout)]
        assert len(together) == ranks and min(together) > 0, _explain(r)
    if replayed and not cuda:
        # (the batches' step loops reduce into a residual: every rank replays such steps, and
        # the steps that gather the residual's partial results, as one template each)
        for what in ("with the task's reductions", "gathering partial results"):
            seen = [int(m) for m in re.findall(rf"(\d+) {what}", r.stdout)]
            assert len(seen) == ranks and min(seen) > 0, (what, _explain(r))


# ------------------------------------------------------------------------------- graphs, collectives


@needs_mpi
@pytest.mark.mpi
def test_behaviours_5_and_11_and_collective_groups_on_every_rank():
    r = mpirun(2, "behaviours.py")
    assert r.returncode == 0, _explain(r)
    assert "rank 0: ok" in r.stdout and "rank 1: ok" in r.stdout, _explain(r)


@needs_mpi
@pytest.mark.mpi
def test_communicator_protocol():
    _every_rank_ok(mpirun(3, "comm_unit.py", timeout=60), 3)


@needs_mpi
@pytest.mark.mpi
def test_first_reductions_of_two_collective_groups_in_opposite_orders_do_not_deadlock():
    """mpi4py's own pickled reductions block holding the GIL on first use (a communicator
    duplicate): two groups starting theirs in opposite orders on two ranks deadlocked
    (the fuzzer's 4-rank batch hung so).  ``CollectiveComm``'s give mpi4py's results."""
    _every_rank_ok(mpirun(2, "collective_first_use.py", timeout=60), 2)


# ------------------------------------------------------------------------------- failures


@needs_mpi
@pytest.mark.mpi
def test_kernel_failure_on_rank_2_ends_every_rank():
    r = mpirun(4, "kernel_failure.py", timeout=60)
    assert r.returncode != 0, _explain(r)
    assert r.seconds < 30, f"took {r.seconds:.1f} s"
    assert "finished normally" not in r.stdout, _explain(r)
    assert "kernel 'boom'" in r.stderr and "rank 2" in r.stderr and "kaboom on purpose" in r.stderr, _explain(r)


@needs_mpi
@pytest.mark.mpi
def test_dependents_of_a_failed_kernel_never_run_under_mpiexec(tmp_path):
    r = mpirun(2, "dependent_failure.py", str(tmp_path), timeout=60)
    assert r.returncode != 0, _explain(r)
    assert "finished normally" not in r.stdout, _explain(r)
    ran = sorted(p.name for p in tmp_path.iterdir())
    # only rank 0's reader of its own, complete chunk may have run
    assert set(ran) <= {"reads_same_chunk-rank0-0"}, ran
    assert re.search(r"KernelError: kernel 'explodes' of task T\d+ failed on rank 1, chunk Box", r.stderr), _explain(r)
    assert "ValueError: boom on purpose" in r.stderr, _explain(r)


@needs_mpi
@pytest.mark.mpi
def test_uncaught_exception_in_script_ends_every_rank():
    r = mpirun(2, "uncaught.py", timeout=60)
    assert r.returncode != 0, _explain(r)
    assert r.seconds < 30, f"took {r.seconds:.1f} s"
    assert "finished normally" not in r.stdout, _explain(r)
    assert "RuntimeError: user bug on rank 1" in r.stderr, _explain(r)
    assert "celeritas rank 1: uncaught RuntimeError; aborting all ranks" in r.stderr, _explain(r)


@needs_mpi
@pytest.mark.mpi
def test_divergent_task_streams_name_the_first_differing_task():
    r = mpirun(2, "divergence.py", "extra", timeout=60)
    assert r.returncode != 0, _explain(r)
    assert "finished normally" not in r.stdout, _explain(r)
    assert "submitted different task streams" in r.stderr, _explain(r)
    assert "T2 (device_compute 'extra', range [64])" in r.stderr, _explain(r)
    assert "T2 (device_compute 'reader', range [64])" in r.stderr, _explain(r)


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("mode,rank0,rank1", [
    ("extra_last", "T2 (epoch of q.wait())", "T2 (device_compute 'extra', range [64])"),
    ("different", "T2 (device_compute 'update', range [64])", "T2 (device_compute 'update_v2', range [32])"),
    # rank 1 never reaches an epoch: it compares what it submitted with rank 0's stretch at once
    ("stuck", "T3 (shutdown epoch", "T3 (device_compute 'only_on_rank_1', range [64])"),
    # buffers are part of the stream: their shapes and dtypes, and that every rank makes them
    ("buffer_shape", "buffer B1 float32 of shape (32,) (made before T2)",
     "buffer B1 float32 of shape (33,) (made before T2)"),
    ("buffer_extra", "buffer B1 float32 of shape (32,) (made before T2)",
     "buffer B1 int32 of shape (8,) (made before T2)"),
])
def test_divergence_names_the_first_task_that_differs(mode, rank0, rank1):
    r = mpirun(2, "divergence.py", mode, env={"CELERITAS_DIVERGENCE_TIMEOUT": "60"}, timeout=60)
    assert r.returncode != 0, _explain(r)
    assert r.seconds < 30, f"took {r.seconds:.1f} s"
    assert "finished normally" not in r.stdout, _explain(r)
    assert "did not submit a matching epoch" not in r.stderr, _explain(r)     # found, not timed out
    assert re.search(r"DivergenceError: ranks [01] and [01] submitted different task streams; the first "
                     r"differing task", r.stderr), _explain(r)
    assert f"rank 0 submitted {rank0}" in r.stderr and f"rank 1 submitted {rank1}" in r.stderr, _explain(r)


@needs_mpi
@pytest.mark.mpi
def test_divergence_where_a_rank_never_reaches_the_epoch_times_out():
    r = mpirun(2, "divergence.py", "silent", env={"CELERITAS_DIVERGENCE_TIMEOUT": "3"}, timeout=60)
    assert r.returncode != 0, _explain(r)
    assert r.seconds < 30, f"took {r.seconds:.1f} s"
    assert "rank 0 reached epoch #2 (T3, shutdown) but rank 1 did not submit a matching epoch within 3 s" \
        in r.stderr, _explain(r)
    assert "the last epoch both reached is T2" in r.stderr, _explain(r)


@needs_mpi
@pytest.mark.mpi
def test_aborting_rank_shows_the_failing_line_of_the_users_code():
    r = mpirun(2, "failure_origin.py", timeout=60)
    assert r.returncode != 0, _explain(r)
    script = SCRIPTS / "failure_origin.py"
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "FAILS HERE" in text)
    assert "celeritas rank 1: KernelError: kernel 'divides' of task T1 failed on rank 1" in r.stderr, _explain(r)
    assert f'File "{script}", line {line}, in kernel' in r.stderr, _explain(r)
    assert "w[chunk] = w[chunk] * (1 / (q.rank - 1))   # FAILS HERE on rank 1" in r.stderr, _explain(r)
    assert "\nZeroDivisionError: division by zero" in r.stderr, _explain(r)


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("mode,target,pending", [
    ("data", r"q\.wait\(\) has waited \d+\.\d s for T3 \(epoch\)",
     r'  - receive of B0 "halo" for task T2: \[32:64\] still missing, no rank has announced it yet\n'),
    ("barrier", r"q\.wait\(barrier=True\) has waited \d+\.\d s for T1 \(barrier epoch\)",
     r"  - rank 1 to reach its epoch matching T1 \(barrier, epoch #1\)"),
])
def test_a_blocked_rank_says_what_it_waits_for(mode, target, pending):
    r = mpirun(2, "wait_warning.py", mode, env={"CELERITAS_WAIT_WARNING": "1"}, timeout=60)
    assert r.returncode == 0, _explain(r)
    assert re.search(f"celeritas rank 0: {target}; this rank still waits for:\n{pending}", r.stderr), _explain(r)
    assert r.stderr.count("has waited") == 1, _explain(r)      # once: the repeat is far slower


# ------------------------------------------------------------------------------- CLI


@needs_mpi
@pytest.mark.mpi
def test_cli_run_starts_ranks_with_devices_and_arguments():
    argv = [sys.executable, "-m", "celeritas", "run", "-n", "2", "--devices", "host:2",
            str(SCRIPTS / "cli_probe.py"), "alpha", "--beta"]
    r = run_job(argv, _env("host:1"), 120)
    assert r.returncode == 0, _explain(r)
    for k in range(2):
        assert (f"rank={k} ranks=2 devices=2 comm=MpiCommunicator env=host:2 args=['alpha', '--beta'] "
                f"total=28") in r.stdout, _explain(r)


@needs_mpi
@pytest.mark.mpi
def test_cli_single_rank_mpiexec_uses_the_single_rank_communicator():
    argv = [sys.executable, "-m", "celeritas", "run", "-n", "1", str(SCRIPTS / "cli_probe.py")]
    r = run_job(argv, _env("host:1"), 120)
    assert r.returncode == 0, _explain(r)
    assert "rank=0 ranks=1 devices=1 comm=SingleRankCommunicator" in r.stdout, _explain(r)


@needs_mpi
@pytest.mark.mpi
def test_cli_info():
    r = run_job([sys.executable, "-m", "celeritas", "info"], _env("host:1"), 120)
    assert r.returncode == 0, _explain(r)
    for text in ("backends and devices", "host", "MPI library", "MPI_THREAD_MULTIPLE", str(MPIEXEC), "huge pages"):
        assert text in r.stdout, _explain(r)


def test_cli_graphs_on_an_empty_folder(tmp_path):
    r = run_job([sys.executable, "-m", "celeritas", "graphs", str(tmp_path)], _env("host:1"), 60)
    assert r.returncode == 1, _explain(r)         # an empty folder: nothing to render
    assert "no .dot files" in r.stderr, _explain(r)


def test_cli_rejects_bad_devices():
    r = run_job([sys.executable, "-m", "celeritas", "run", "-n", "2", "--devices", "gpu:7", "x.py"],
                _env("host:1"), 60)
    assert r.returncode == 2 and "not a device list" in r.stderr, _explain(r)


# ------------------------------------------------------------------------------- launcher (no MPI)


def test_launcher_flavor_detection():
    from celeritas import launcher
    assert launcher.classify_version_text("mpiexec (OpenRTE) 4.1.2\nReport bugs") == launcher.OPENMPI
    assert launcher.classify_version_text("prterun (Open MPI) 5.0.3") == launcher.OPENMPI
    assert launcher.classify_version_text("HYDRA build details:\n    Version: 4.1") == launcher.MPICH
    assert launcher.classify_version_text("Intel(R) MPI Library for Linux") == launcher.INTEL
    assert launcher.classify_version_text("something else") == launcher.UNKNOWN


def test_launcher_openmpi_flags_only_where_needed():
    from celeritas import launcher
    om = launcher.Mpiexec("/opt/ompi/bin/mpiexec", launcher.OPENMPI)
    cmd = launcher.build_command(8, "app.py", ["-x"], mpiexec=om, devices="host:2", is_root=True, cores=2,
                                 env={"PATH": "/bin"}, python="/py")
    assert cmd.argv[:6] == ["/opt/ompi/bin/mpiexec", "-n", "8", "--allow-run-as-root", "--oversubscribe", "-x"]
    assert cmd.argv[6] == "CELERITAS_DEVICES" and cmd.argv[-3:] == ["/py", "app.py", "-x"]
    assert cmd.env["CELERITAS_DEVICES"] == "host:2" and cmd.env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    cmd = launcher.build_command(2, "app.py", mpiexec=om, is_root=False, cores=2, env={}, python="/py")
    assert cmd.argv == ["/opt/ompi/bin/mpiexec", "-n", "2", "/py", "app.py"]
    mp = launcher.Mpiexec("/usr/bin/mpiexec", launcher.MPICH)
    cmd = launcher.build_command(8, "apps.wave_sim", ["-N", "64"], mpiexec=mp, module=True, is_root=True, cores=2,
                                 env={}, python="/py")
    assert cmd.argv == ["/usr/bin/mpiexec", "-n", "8", "/py", "-m", "apps.wave_sim", "-N", "64"]


def test_the_test_jobs_speak_each_launchers_language(monkeypatch):
    """The test harness runs its mpiexec jobs under MPICH or Open MPI (CI does both): an
    Open MPI session gets root and oversubscription through the environment its jobs
    inherit, without overriding a caller's own settings, and a per-program setting of an
    A : B command line is MPICH's -env K V or Open MPI's -x K=V."""
    root = jobs.open_mpi_session_env({}, is_root=True)
    assert root == {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
                    "OMPI_MCA_rmaps_base_oversubscribe": "1",
                    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    user = jobs.open_mpi_session_env({"PRTE_MCA_rmaps_default_mapping_policy": ":slot"}, is_root=False)
    assert user == {"OMPI_MCA_rmaps_base_oversubscribe": "1"}
    settings = {"CELERITAS_DEVICES": "host:0", "CELERITAS_LOOKAHEAD": "none"}
    monkeypatch.setattr(jobs, "_FLAVOR", ["openmpi"])
    assert jobs.rank_env_args(settings) == ["-x", "CELERITAS_DEVICES=host:0", "-x", "CELERITAS_LOOKAHEAD=none"]
    monkeypatch.setattr(jobs, "_FLAVOR", ["mpich"])
    assert jobs.rank_env_args(settings) == ["-env", "CELERITAS_DEVICES", "host:0",
                                            "-env", "CELERITAS_LOOKAHEAD", "none"]


def test_launcher_prefers_the_interpreters_mpiexec():
    from celeritas import launcher
    found = launcher.find_mpiexec()
    if MPIEXEC.exists():
        assert found == str(MPIEXEC)


def test_launched_under_mpi_reads_the_launcher_environment(monkeypatch):
    from executor import mpi as mc
    for v in mc.ENV_SIZE_VARS + ("SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(v, raising=False)
    assert not mc.launched_under_mpi()
    monkeypatch.setenv("PMI_SIZE", "1")
    assert not mc.launched_under_mpi()         # one rank: the single-rank communicator
    monkeypatch.setenv("PMI_SIZE", "4")
    assert mc.launched_under_mpi() and mc.launched_world_size() == 4
    monkeypatch.delenv("PMI_SIZE")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert mc.launched_under_mpi()


def test_strided_layouts():
    from executor.mpi import strided_layout
    a = np.zeros((8, 10, 12), np.float32)
    assert strided_layout(a.shape, a.strides, 4) == (8 * 10 * 12 * 4, [])
    v = a[:, 2:5]
    assert strided_layout(v.shape, v.strides, 4) == (3 * 12 * 4, [(8, 480)])
    v = a[:, :, 3:4]
    assert strided_layout(v.shape, v.strides, 4) == (4, [(80, 48)])
    v = a[:, 1:9, 2:4]
    assert strided_layout(v.shape, v.strides, 4) == (8, [(8, 480), (8, 48)])
    v = a[::-1]
    assert strided_layout(v.shape, v.strides, 4) is None


@needs_mpi
@pytest.mark.mpi
def test_less_than_thread_multiple_is_a_clear_config_error():
    r = mpirun(2, "thread_level.py", timeout=60)
    assert r.returncode == 0, _explain(r)
    assert r.stdout.count("ConfigError:") == 2, _explain(r)
    assert "MPI_THREAD_SERIALIZED" in r.stdout and "needs MPI_THREAD_MULTIPLE" in r.stdout, _explain(r)


@pytest.mark.parametrize("var,value,words", [
    ("CELERITAS_MPI_POLL_MAX_US", "fast", "not a number of microseconds"),
    ("CELERITAS_MPI_POLL_MAX_US", "-5", "must be > 0"),
    ("CELERITAS_MPI_SPIN_US", "long", "not a number of microseconds"),
    ("CELERITAS_MPI_SPIN_US", "-1", "must be a finite number >= 0"),
    ("CELERITAS_MPI_STRIDED", "sideways", "use one of auto, datatype, staging"),
    ("CELERITAS_DIVERGENCE_TIMEOUT", "soon", "not a number of seconds"),
    ("CELERITAS_DIVERGENCE_TIMEOUT", "-1", "must be > 0"),
    ("CELERITAS_MPI_CUDA_AWARE", "perhaps", "use 1 or 0"),
])
def test_bad_mpi_settings_fail_before_any_mpi_call(monkeypatch, var, value, words):
    """The runtime parses the configuration before it creates the MPI communicator, so a
    bad value leaves no rank half-initialized (here: a launch under MPI is faked)."""
    import builtins

    import celeritas as cl
    from celeritas.runtime import Runtime
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv(var, value)
    real_import = builtins.__import__

    def no_mpi(name, *args, **kwargs):
        if name.startswith("mpi4py"):
            raise AssertionError("mpi4py imported before the configuration was checked")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpi)
    with pytest.raises(cl.ConfigError, match=f"{var}=.*{words}"):
        Runtime.current(create=True)


def test_mpi_settings_are_parsed_once_by_the_configuration():
    from celeritas.config import from_env
    c = from_env({})
    assert (c.mpi_strided, c.mpi_poll_max_us, c.divergence_timeout, c.mpi_cuda_aware) == \
        ("auto", 2000.0, 300.0, None)
    c = from_env({"CELERITAS_MPI_STRIDED": "Staging", "CELERITAS_MPI_POLL_MAX_US": "50",
                  "CELERITAS_DIVERGENCE_TIMEOUT": "none", "CELERITAS_MPI_CUDA_AWARE": "1"})
    assert (c.mpi_strided, c.mpi_poll_max_us, c.divergence_timeout, c.mpi_cuda_aware) == \
        ("staging", 50.0, None, True)
    assert from_env({"CELERITAS_DIVERGENCE_TIMEOUT": "2.5", "CELERITAS_MPI_CUDA_AWARE": "0"}).mpi_cuda_aware is False
    assert from_env({"CELERITAS_DIVERGENCE_TIMEOUT": "2.5"}).divergence_timeout == 2.5
    assert from_env({}).mpi_spin_us == 500.0
    assert from_env({"CELERITAS_MPI_SPIN_US": "0"}).mpi_spin_us == 0.0
    assert from_env({"CELERITAS_MPI_SPIN_US": " 250 "}).mpi_spin_us == 250.0


def test_mpi_code_reads_no_celeritas_variables():
    """Configuration is read once, by celeritas/config.py: the executor's code (not its
    docstrings or comments) names no CELERITAS_ variable."""
    import ast
    import io
    import tokenize
    for f in (ROOT / "executor").rglob("*.py"):
        text = f.read_text()
        docstrings = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    docstrings.add(first.value.lineno)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and "CELERITAS_" in tok.string and tok.start[0] not in docstrings:
                pytest.fail(f"{f.relative_to(ROOT)}:{tok.start[0]} names a CELERITAS_ variable in code: {tok.string}")


def test_mpi_communicator_rejects_bad_arguments_before_any_mpi_call(monkeypatch):
    import builtins

    from executor.mpi import MpiCommunicator
    real_import = builtins.__import__

    def no_mpi(name, *args, **kwargs):
        if name.startswith("mpi4py"):
            raise AssertionError("mpi4py imported before the arguments were checked")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpi)
    with pytest.raises(ConfigError, match="use auto, datatype or staging"):
        MpiCommunicator(strided="sideways")
    with pytest.raises(ConfigError, match="must be > 0"):
        MpiCommunicator(poll_max=0)
    with pytest.raises(ConfigError, match="must be >= 0"):
        MpiCommunicator(poll_spin=-1e-6)
    with pytest.raises(ConfigError, match="must be > 0"):
        MpiCommunicator(divergence_timeout=-1)


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_hand_written_baselines_compute_what_the_apps_compute(ranks):
    """The mpi4py baselines the benchmarks and the scaling study compare celeritas with
    (cluster/workloads.py) give the apps' reference results on every rank count."""
    _every_rank_ok(mpirun(ranks, "handwritten_baselines.py", timeout=120), ranks)


@needs_mpi
@pytest.mark.mpi
def test_bench_mpi_programs_move_the_bytes_they_time():
    """bench_mpi's row mappers, with kernels that fill rows on rank 0 and check them on
    rank 1: the stream's windows and the ping-pong's hops deliver every row's value."""
    _every_rank_ok(mpirun(2, "stream_check.py", timeout=120), 2)


@needs_mpi
@pytest.mark.mpi
def test_bench_mpi_quick_reports_ping_pong_and_streaming_rows(tmp_path):
    """A smoke run of the MPI benchmark: its JSON holds the ping-pong and streaming figures
    with their same-run baselines, and run_all turns them into table rows."""
    out = tmp_path / "mpi.json"
    argv = [str(MPIEXEC), "-n", "2", sys.executable, str(ROOT / "benchmarks" / "bench_mpi.py"), "--quick",
            "--reps", "1", "--skip-wave", "--json", str(out)]
    r = run_job(argv, _env("host:1"), 240)
    assert r.returncode == 0, _explain(r)
    import json

    from benchmarks.run_all import mpi_rows_from
    data = json.loads(out.read_text())
    assert [p["bytes"] for p in data["pingpong"]][0] == 8
    assert data["stream"] and all(s["celeritas_s"] > 0 and s["mpi4py_s"] > 0 and s["window"] >= 2
                                  for s in data["stream"])
    # the largest size also in paired windows (celeritas and mpi4py back to back), 4 in a quick run
    paired = data["pingpong"][-1]["paired_ratios"]
    assert len(paired) == 4 and all(r > 0 for r in paired)
    rows = mpi_rows_from(data)
    names = [row.benchmark for row in rows]
    assert any(n.startswith("push/await_push streaming bandwidth, 64 KiB") for n in names), names
    assert any(n.startswith("push/await_push one-way latency") for n in names), names
    (bw,) = [row for row in rows if row.benchmark.startswith("push/await_push bandwidth, 64 KiB")]
    assert "paired windows:" in bw.goal and "median of 4" in bw.goal, bw.goal
