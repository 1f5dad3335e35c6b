"""Adversarial probes of the configuration, the CLI, multi-rank misuse and the outputs.

A second probing round (the first, of the core Python API, is tests/test_api_probing.py):
every ``CELERITAS_*`` variable of docs/api.md's configuration table with malformed,
out-of-range, empty, whitespace, mixed-case and conflicting values; ``cl.Queue``
arguments that conflict with the environment or with a running runtime; ``python -m
celeritas`` with wrong arguments, missing files and scripts that fail on one rank;
ranks of a simulated cluster (``cl.testing.run_cluster``) and of a real ``mpiexec -n 2``
job that raise, exit early, submit different work or run slowly; and the shutdown
outputs (``CELERITAS_PRINT_GRAPHS``, ``CELERITAS_TRACE``, ``CELERITAS_SUMMARY``).

The project rule: every bad input gets a clear ``cl.*Error`` (the class docs/api.md's
error table names) naming what was wrong (variable and value, task, buffer, rank), never
a hang, a bare traceback from deep inside, a silently ignored setting or a lost result.

The first group are the defects found, each asserting what the rule requires (its
docstring gives the input, what happened and what should; all are fixed now).  The second
group pins probes that already behave well and are not pinned elsewhere
(tests/test_errors.py, test_cli.py, test_mpi.py, test_timeline.py, test_differential.py).
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from jobs import (
    MPIEXEC,
    ROOT,
    clean_env,
    explain,
    job_or_none,
    needs_mpi,
    needs_rank_env,
    rank_env_args,
)

import celeritas as cl
from celeritas.__main__ import main
from celeritas.testing import run_cluster

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("clean_environment")]


_env = clean_env


def _job(argv: list, env: dict, timeout: float, cwd=None) -> subprocess.CompletedProcess | None:
    return job_or_none(argv, env, timeout, cwd=cwd or ROOT)


_explain = explain


def _touch(b, name, n=16):
    def cgf(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((n,), lambda c: w.__setitem__(c, w[c] + 1), name=name)
    return cgf


def _shutdown_quietly(q):
    if q is not None:
        try:
            q.shutdown()
        except cl.CeleritasError:
            pass


# =====================================================================================
# Defects found by probing: each asserts what the rule requires
# =====================================================================================


def test_ranks_submitting_different_task_counts_before_a_fence_get_a_divergence_error():
    """Input (2 simulated ranks, CELERITAS_DIVERGENCE_TIMEOUT=2): rank 0 submits three
    kernels on buffer b, rank 1 two, then both fence b.  Happens: each rank waits for the
    other's part of b (T3 vs T4 never match); only the wait warning says so, and the
    result(timeout=8) of this probe ends it with a bare TimeoutError (without the timeout,
    and under a real mpiexec -n 2, the job hangs until killed).  Expected: a
    cl.DivergenceError naming both ranks' differing tasks within the divergence timeout."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")
        for _ in range(3 if rank == 0 else 2):
            q.submit(_touch(b, "step"))
        return q.fence(b).result(timeout=8)

    with pytest.raises(cl.DivergenceError, match="ranks [01] and [01] submitted different task streams") as ei:
        run_cluster(program, nodes=2, timeout=30, CELERITAS_DEVICES="host:1", CELERITAS_DIVERGENCE_TIMEOUT="2")
    msg = str(ei.value)     # (found from the pending tasks the stalled ranks show each other)
    assert "rank 0 submitted T3 (device_compute 'step', range [16])" in msg and "rank 1 submitted T3 (a fence)" in msg


@needs_mpi
@needs_rank_env
def test_an_invalid_setting_on_one_rank_only_ends_the_whole_job(tmp_path):
    """Input: mpiexec -n 1 python s.py : -n 1 -env CELERITAS_DEVICES host:0 python s.py
    (CELERITAS_DIVERGENCE_TIMEOUT=3), where s.py makes a Queue and waits at a barrier — a
    node whose device list is wrong.  Happens: rank 1 prints its ConfigError and exits;
    rank 0 never returns from cl.Queue() and the job runs until killed.  Expected: the
    job ends (non-zero) within seconds with rank 1's ConfigError naming CELERITAS_DEVICES
    (as a ConfigError found after MPI start-up does: see the passing test below)."""
    script = tmp_path / "s.py"
    script.write_text("import celeritas as cl\nq = cl.Queue()\nq.wait(barrier=True)\nprint('done', flush=True)\n")
    argv = [MPIEXEC, "-n", "1", sys.executable, script, ":",
            "-n", "1", *rank_env_args({"CELERITAS_DEVICES": "host:0"}), sys.executable, script]
    r = _job(argv, _env({"CELERITAS_DEVICES": "host:1", "CELERITAS_DIVERGENCE_TIMEOUT": "3"}), timeout=20)
    assert r is not None, _explain(r)
    assert r.returncode != 0 and "CELERITAS_DEVICES='host:0'" in r.stderr, _explain(r)


def test_a_trace_path_that_is_a_directory_is_a_config_error_at_start(monkeypatch, tmp_path):
    """Input: CELERITAS_TRACE=<an existing directory>.  Happens: cl.Queue() starts, the
    run finishes, and shutdown logs "could not write the execution trace" with a bare
    IsADirectoryError traceback; no trace.  Expected (as for an unwritable folder,
    config.check_output_paths and test_errors' unwritable-path test): cl.ConfigError at
    cl.Queue() naming CELERITAS_TRACE and the path."""
    monkeypatch.setenv("CELERITAS_TRACE", str(tmp_path))
    q = None
    try:
        with pytest.raises(cl.ConfigError, match=r"CELERITAS_TRACE.*" + re.escape(str(tmp_path))):
            q = cl.Queue()
    finally:
        _shutdown_quietly(q)


@pytest.mark.parametrize("var", ["CELERITAS_TRACE", "CELERITAS_PRINT_GRAPHS"])
def test_a_whitespace_only_output_path_is_unset_or_an_error(monkeypatch, tmp_path, var):
    """Input: CELERITAS_TRACE='   ' (or CELERITAS_PRINT_GRAPHS='   '), e.g. from a job
    script's VAR=" $EMPTY ".  Happens: the trace file (the graph folder) '   ' is written
    into the working directory.  Expected: treated as unset like the other variables'
    whitespace values (nothing written), or a cl.ConfigError naming the variable."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(var, "   ")
    try:
        q = cl.Queue()
    except cl.ConfigError as exc:
        assert var in str(exc)
        return
    b = cl.Buffer(np.arange(4.0), name="b")
    q.fence(b).result(timeout=30)
    q.shutdown()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_misspelt_variable_is_reported(monkeypatch, caplog, capfd):
    """Input: CELERITAS_DEVICE=host:2 (the S missing) and cl.Queue().  Happens: the runtime
    runs on host:1 and nothing mentions the variable (python -m celeritas info even lists it
    as 'valid: yes').  Expected: a warning naming CELERITAS_DEVICE (ideally suggesting
    CELERITAS_DEVICES) when the runtime starts."""
    monkeypatch.setenv("CELERITAS_DEVICE", "host:2")
    with caplog.at_level(logging.WARNING):
        q = cl.Queue()
        q.shutdown()
    text = caplog.text + capfd.readouterr().err
    assert "CELERITAS_DEVICE" in text


def _default_is_host() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return True
    return False


@pytest.mark.skipif(not _default_is_host(), reason="the default devices here may be CUDA GPUs")
def test_a_devices_conflict_with_the_running_runtime_names_its_devices():
    """Input: cl.Queue() (default devices: host:1 without a GPU), then
    cl.Queue(devices="host:2").  Happens: cl.ConfigError "the runtime already runs on
    default; create the Queue with devices='host:2' before any Buffer".  Expected: the
    message names the devices the runtime runs on, host:1."""
    q = cl.Queue()
    try:
        with pytest.raises(cl.ConfigError, match=r"already runs on host:1\b"):
            cl.Queue(devices="host:2")
    finally:
        q.shutdown()


@pytest.mark.skipif(not _default_is_host(), reason="the default devices here may be CUDA GPUs")
def test_asking_for_the_devices_the_runtime_already_runs_on_is_fine():
    """Input: cl.Queue() (default devices, host:1 without a GPU), then
    cl.Queue(devices="host:1").  Happens: cl.ConfigError "the runtime already runs on
    default".  Expected (docs/api.md: asking for *other* devices raises): a second queue
    on the same runtime, 1 device."""
    q = cl.Queue()
    try:
        assert cl.Queue(devices="host:1").num_devices == 1
    finally:
        q.shutdown()


def test_a_missing_device_given_as_an_argument_names_the_argument():
    """Input: CELERITAS_DEVICES unset, cl.Queue(devices="opencl:7:0") (no platform 7).
    Happens: cl.ConfigError "CELERITAS_DEVICES='opencl:7:0': OpenCL platform 7 does not
    exist ...".  Expected: the message names the argument (devices='opencl:7:0'), as
    cl.Queue(devices="host:0") does, not a variable the user never set."""
    with pytest.raises(cl.ConfigError) as ei:
        cl.Queue(devices="opencl:7:0")
    assert "opencl:7:0" in str(ei.value) and "CELERITAS_DEVICES" not in str(ei.value)


@pytest.mark.parametrize("value", ["0.4", "1e300"])
def test_an_out_of_range_switch_interval_is_a_config_error_or_honoured(monkeypatch, value):
    """Input: CELERITAS_SWITCH_INTERVAL_US=0.4 (or 1e300).  Happens: the runtime runs with
    sys.getswitchinterval() == 0.0 (the interpreter truncates to whole µs and overflows).
    Expected: a cl.ConfigError naming the variable and the value, or an interval > 0."""
    import sys as _sys
    monkeypatch.setenv("CELERITAS_SWITCH_INTERVAL_US", value)
    try:
        q = cl.Queue()
    except cl.ConfigError as exc:
        assert "CELERITAS_SWITCH_INTERVAL_US" in str(exc) and value in str(exc)
        return
    try:
        assert _sys.getswitchinterval() > 0
    finally:
        q.shutdown()


def test_a_dry_run_on_a_multi_rank_cluster_is_an_error_or_keeps_the_ranks():
    """Input: run_cluster(program, nodes=2, CELERITAS_DRY_RUN_NODES="4"), program returns
    q.rank.  Happens: [0, 0] (each rank runs as rank 0 of 4; under a real mpiexec -n 2
    both processes print 'rank 0 of 4' and write the same graph folder).  Expected: a
    cl.ConfigError naming CELERITAS_DRY_RUN_NODES and the real ranks, or ranks [0, 1]."""
    try:
        ranks = run_cluster(lambda rank: cl.Queue().rank, nodes=2, timeout=30, CELERITAS_DRY_RUN_NODES="4")
    except cl.ConfigError as exc:
        assert "CELERITAS_DRY_RUN_NODES" in str(exc)
        return
    assert ranks == [0, 1]


def test_the_summary_of_a_dry_run_does_not_ask_for_the_setting_already_given(monkeypatch, capfd):
    """Input: CELERITAS_DRY_RUN_NODES=2 CELERITAS_SUMMARY=1, one kernel, shutdown.
    Happens: the summary ends with the advice to set CELERITAS_SUMMARY=1.  Expected: it
    says that a dry run executes nothing (so there are no lane times)."""
    monkeypatch.setenv("CELERITAS_DRY_RUN_NODES", "2")
    monkeypatch.setenv("CELERITAS_SUMMARY", "1")
    q = cl.Queue()
    b = cl.Buffer(np.zeros(16), name="b")
    q.submit(_touch(b, "k"))
    q.wait()
    q.shutdown()
    captured = capfd.readouterr()
    out = " ".join((captured.out + captured.err).split())
    assert "instructions by kind" in out                       # (the summary was printed)
    assert "CELERITAS_SUMMARY=1 or CELERITAS_TRACE turn it on" not in out


@pytest.mark.parametrize("what", ["folder", "plain_file"])
def test_run_with_an_mpiexec_that_is_not_executable_is_a_clear_error(tmp_path, monkeypatch, capsys, what):
    """Input: python -m celeritas run --mpiexec <a folder | notes.txt> prog.py.  Happens:
    PermissionError (folder) or FileNotFoundError (a relative plain file) out of
    subprocess.  Expected: exit status 2 and "error: ... mpiexec ... <path> ..." as for a
    path that does not exist ("mpiexec '/no/such' not found")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prog.py").write_text("print('hi')\n")
    if what == "folder":
        target = str(tmp_path / "sub")
        os.mkdir(target)
    else:
        target = "notes.txt"
        (tmp_path / target).write_text("not a program\n")
    assert main(["run", "--mpiexec", target, "prog.py"]) == 2
    err = capsys.readouterr().err
    assert "mpiexec" in err and target in err and "Traceback" not in err


@pytest.mark.parametrize("kwargs, named", [
    ({"nodes": 2.5}, "nodes"),
    ({"nodes": "2"}, "nodes"),
    ({"nodes": 2, "devices": 2.7}, "devices"),
    ({"nodes": 2, "LOOKAHEAD": "none"}, "LOOKAHEAD"),
])
def test_run_cluster_argument_misuse_is_a_celeritas_error(kwargs, named):
    """Input: cl.testing.run_cluster(program, nodes=2.5) / nodes="2" / devices=2.7 /
    LOOKAHEAD="none" (the prefix forgotten).  Happens: TypeError "can't multiply sequence
    by non-int of type 'float'" / "'<' not supported between 'str' and 'int'"; host:2 per
    rank; the keyword ignored.  Expected: a cl.CeleritasError naming the argument (as
    nodes=0 gives "run_cluster needs nodes >= 1")."""
    with pytest.raises(cl.CeleritasError, match=named):
        run_cluster(lambda rank: cl.Queue().num_devices, timeout=30, **kwargs)


# =====================================================================================
# Probes that already behave well (not pinned elsewhere)
# =====================================================================================


@pytest.mark.parametrize("var, value", [
    ("CELERITAS_DEVICES", "host:-1"), ("CELERITAS_DEVICES", "opencl:9"), ("CELERITAS_DEVICES", "cuda:0, 1"),
    ("CELERITAS_DEVICES", "host: 2"), ("CELERITAS_DEVICES", "host:2,host:3"), ("CELERITAS_DEVICES", "host:"),
    ("CELERITAS_LOOKAHEAD", "eventually"), ("CELERITAS_HORIZON_STEP", "3.0"), ("CELERITAS_DRY_RUN_NODES", "0"),
    ("CELERITAS_SUMMARY", "2"), ("CELERITAS_HOST_DEVICE_MEMORY", "0.5"), ("CELERITAS_HOST_DEVICE_MEMORY", "0"),
    ("CELERITAS_DEVICE_MEMORY_LIMIT", "2GB of it"), ("CELERITAS_DEVICE_MEMORY_LIMIT", "-1"),
    ("CELERITAS_DEVICE_MEMORY_LIMIT", "1.5"), ("CELERITAS_REPLAY", "true"), ("CELERITAS_OUT_OF_CORE_OVERLAP", "1"),
    ("CELERITAS_WAIT_WARNING", "nan"), ("CELERITAS_WAIT_WARNING", "10s"), ("CELERITAS_WAIT_WARNING", "-1"),
    ("CELERITAS_LOG_LEVEL", "WARN"), ("CELERITAS_HUGE_PAGES", "2M"), ("CELERITAS_MPI_POLL_MAX_US", "0"),
    ("CELERITAS_MPI_SPIN_US", "inf"), ("CELERITAS_INLINE_US", "nan"), ("CELERITAS_SWITCH_INTERVAL_US", "-3"),
    ("CELERITAS_DIVERGENCE_TIMEOUT", "5m"), ("CELERITAS_MPI_CUDA_AWARE", "yes"), ("CELERITAS_MPI_STRIDED", "x"),
])
def test_a_malformed_value_is_a_config_error_naming_variable_and_value(monkeypatch, var, value):
    """Input: VAR=value (malformed, out of range or a near miss) and cl.Queue().
    Expected: cl.ConfigError (a ValueError) whose message holds VAR='value'; no runtime
    is left half-started."""
    monkeypatch.setenv(var, value)
    with pytest.raises(cl.ConfigError, match=re.escape(f"{var}={value!r}")) as ei:
        cl.Queue()
    assert isinstance(ei.value, ValueError)
    monkeypatch.delenv(var)
    cl.Queue().shutdown()


def test_case_whitespace_and_empty_values_are_accepted_as_documented(monkeypatch):
    """Input: CELERITAS_DEVICES=' HOST:2 ', CELERITAS_LOOKAHEAD='', CELERITAS_DIAGNOSTICS='ERROR',
    CELERITAS_WAIT_WARNING='OFF', CELERITAS_DIVERGENCE_TIMEOUT='INF', CELERITAS_RECORD='TRUE',
    CELERITAS_GC=' tuned '.  Expected: the runtime starts on 2 devices with the lookahead
    default, diagnostics 'error', no wait warning, no divergence timeout, recording on."""
    for var, value in [("CELERITAS_DEVICES", " HOST:2 "), ("CELERITAS_LOOKAHEAD", ""),
                       ("CELERITAS_DIAGNOSTICS", "ERROR"), ("CELERITAS_WAIT_WARNING", "OFF"),
                       ("CELERITAS_DIVERGENCE_TIMEOUT", "INF"), ("CELERITAS_RECORD", "TRUE"),
                       ("CELERITAS_GC", " tuned ")]:
        monkeypatch.setenv(var, value)
    q = cl.Queue()
    try:
        c = q.runtime.config
        assert q.num_devices == 2
        assert (c.lookahead, c.diagnostics, c.wait_warning, c.divergence_timeout, c.record, c.gc) == \
            ("auto", "error", None, None, True, "tuned")
        assert isinstance(q.graphs(), cl.GraphRecord)
    finally:
        q.shutdown()


def test_queue_arguments_override_the_environment_and_a_later_conflict_names_both(monkeypatch):
    """Input: CELERITAS_DEVICES=host:3 and cl.Queue(devices="host:2"), then
    cl.Queue(devices="host:3") and cl.Queue(lookahead="sometimes").  Expected: 2 devices
    (the argument wins); then cl.ConfigError naming host:2 (running) and 'host:3' (asked);
    an invalid lookahead a ConfigError naming it; the first queue still works."""
    monkeypatch.setenv("CELERITAS_DEVICES", "host:3")
    q = cl.Queue(devices="host:2")
    try:
        assert q.num_devices == 2
        with pytest.raises(cl.ConfigError, match=r"already runs on host:2; create the Queue with devices='host:3'"):
            cl.Queue(devices="host:3")
        with pytest.raises(cl.ConfigError, match="'sometimes'"):
            cl.Queue(lookahead="sometimes")
        b = cl.Buffer(np.arange(4.0), name="b")
        assert q.fence(b).result(timeout=30).tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        q.shutdown()


@pytest.mark.parametrize("argv, words", [
    (["run", "-n", "0", "x.py"], "-n must be at least 1, got 0"),
    (["run", "-n", "-3", "x.py"], "-n must be at least 1, got -3"),
    (["run", "--devices", "host:0", "x.py"], "--devices='host:0': host:N needs 1 <= N <= 64"),
    (["run", "--mpiexec", "/no/such/mpiexec", "x.py"], "mpiexec '/no/such/mpiexec' not found"),
    (["trace", "{tmp}"], "is not a file"),
    (["trace", "{trace}", "--width", "0"], "--width 0 is too narrow"),
])
def test_cli_misuse_exits_2_with_a_message_not_a_traceback(tmp_path, capsys, argv, words):
    """Input: python -m celeritas run -n 0 / -n -3 / --devices host:0 / --mpiexec
    <missing>, trace <a folder>, trace FILE --width 0.  Expected: exit status 2 and one
    "error: ..." line naming the argument; no traceback."""
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 0, "dur": 3, '
                     '"args": {"kind": "device_kernel"}}]}')
    argv = [a.format(tmp=tmp_path, trace=trace) for a in argv]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert words in err and err.startswith("error:") and "Traceback" not in err


def test_cli_info_reports_an_invalid_value_with_exit_1():
    """Input: CELERITAS_LOOKAHEAD=bogus python -m celeritas info.  Expected: exit status 1,
    the table lists the variable and says why it is not valid (its ConfigError)."""
    r = _job([sys.executable, "-m", "celeritas", "info"], _env({"CELERITAS_LOOKAHEAD": "bogus",
                                                                 "COLUMNS": "200"}), timeout=60)
    assert r is not None and r.returncode == 1, _explain(r)
    assert "CELERITAS_LOOKAHEAD" in r.stdout and "ConfigError: CELERITAS_LOOKAHEAD='bogus'" in r.stdout, _explain(r)


@needs_mpi
@pytest.mark.mpi
def test_cli_run_passes_on_the_exit_status_of_a_rank_that_exits_non_zero(tmp_path):
    """Input: python -m celeritas run -n 2 s.py where rank 1 calls sys.exit(3) after a fence
    (its shutdown at exit matches rank 0's q.shutdown()).  Expected: both ranks' results
    printed, the job's exit status 3, no hang."""
    script = tmp_path / "s.py"
    script.write_text("import sys\nimport numpy as np\nimport celeritas as cl\nq = cl.Queue()\n"
                      "b = cl.Buffer(np.arange(16.0), name='b')\n"
                      "print(f'rank {q.rank} sum {q.fence(b).result().sum()}', flush=True)\n"
                      "if q.rank == 1:\n    sys.exit(3)\nq.shutdown()\n")
    r = _job([sys.executable, "-m", "celeritas", "run", "-n", "2", script],
             _env({"CELERITAS_DEVICES": "host:1", "CELERITAS_DIVERGENCE_TIMEOUT": "20"}), timeout=60)
    assert r is not None and r.returncode == 3, _explain(r)
    assert "rank 0 sum 120.0" in r.stdout and "rank 1 sum 120.0" in r.stdout, _explain(r)


@needs_mpi
@pytest.mark.mpi
@needs_rank_env
def test_a_config_error_found_after_mpi_start_up_on_one_rank_ends_the_job(tmp_path):
    """Input: mpiexec -n 1 python s.py : -n 1 -env CELERITAS_DEVICE_MEMORY_LIMIT 0.8 python
    s.py (a fraction, refused for host devices once the backend is made).  Expected: rank
    1's ConfigError naming the variable, the job aborted on every rank, non-zero, quickly."""
    script = tmp_path / "s.py"
    script.write_text("import celeritas as cl\nq = cl.Queue()\nq.wait(barrier=True)\nprint('done', flush=True)\n")
    argv = [MPIEXEC, "-n", "1", sys.executable, script, ":",
            "-n", "1", *rank_env_args({"CELERITAS_DEVICE_MEMORY_LIMIT": "0.8"}), sys.executable, script]
    r = _job(argv, _env({"CELERITAS_DEVICES": "host:1", "CELERITAS_DIVERGENCE_TIMEOUT": "20"}), timeout=60)
    assert r is not None and r.returncode != 0, _explain(r)
    assert "ConfigError: CELERITAS_DEVICE_MEMORY_LIMIT=0.8" in r.stderr, _explain(r)
    assert "celeritas rank 1: uncaught ConfigError; aborting all ranks" in r.stderr, _explain(r)
    assert "done" not in r.stdout, _explain(r)


@needs_mpi
@pytest.mark.mpi
def test_a_rank_that_exits_early_under_mpiexec_is_a_divergence_on_every_rank(tmp_path):
    """Input: mpiexec -n 2, rank 1 calls sys.exit(0) right after cl.Queue() while rank 0
    waits at q.wait(barrier=True).  Expected: both ranks report the cl.DivergenceError
    (rank 1's shutdown epoch against rank 0's barrier epoch); the job ends non-zero."""
    script = tmp_path / "s.py"
    script.write_text("import sys\nimport celeritas as cl\nq = cl.Queue()\nif q.rank == 1:\n    sys.exit(0)\n"
                      "q.wait(barrier=True)\nprint('rank 0 passed the barrier', flush=True)\n")
    r = _job([MPIEXEC, "-n", "2", sys.executable, script],
             _env({"CELERITAS_DEVICES": "host:1", "CELERITAS_DIVERGENCE_TIMEOUT": "20"}), timeout=60)
    assert r is not None and r.returncode != 0, _explain(r)
    assert "passed the barrier" not in r.stdout, _explain(r)
    assert "rank 1 submitted T1 (shutdown epoch" in r.stderr and "T1 (barrier epoch" in r.stderr, _explain(r)


@pytest.mark.parametrize("waits_at", ["fence", "barrier", "collective"])
def test_a_rank_raising_in_its_program_releases_the_rank_waiting_for_it(waits_at):
    """Input (2 simulated ranks): rank 1's program raises ValueError at once, rank 0 waits
    for it at a fence of a buffer it shares / q.wait(barrier=True) / a collective host task
    calling allreduce.  Expected: run_cluster raises rank 1's own ValueError promptly."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")
        if rank == 1:
            raise ValueError("application bug on rank 1")
        if waits_at == "fence":
            q.submit(_touch(b, "step"))
            q.fence(b).result()
        elif waits_at == "barrier":
            q.wait(barrier=True)
        else:
            q.submit(lambda cgh: cgh.host_task(lambda p: p.comm.allreduce(1), on=cl.collective, name="coll"))
            q.wait()

    t0 = time.monotonic()
    with pytest.raises(ValueError, match="application bug on rank 1"):
        run_cluster(program, nodes=2, timeout=60, CELERITAS_DEVICES="host:1")
    assert time.monotonic() - t0 < 20


def test_a_collective_host_task_failing_on_one_rank_releases_the_others():
    """Input (2 simulated ranks): a collective host task that raises on rank 1 while rank 0
    is inside comm.allreduce.  Expected: cl.KernelError naming host task 'coll', rank 1 and
    the ValueError; no hang."""
    def program(rank):
        q = cl.Queue()

        def fn(p):
            if p.rank == 1:
                raise ValueError("collective fails on rank 1")
            p.comm.allreduce(1)

        q.submit(lambda cgh: cgh.host_task(fn, on=cl.collective, name="coll"))
        q.wait()

    with pytest.raises(cl.KernelError, match=r"host task 'coll' of task T\d+ failed on rank 1.*collective fails"):
        run_cluster(program, nodes=2, timeout=60, CELERITAS_DEVICES="host:1")


@pytest.mark.parametrize("how", ["returns", "shuts_down"])
def test_a_rank_leaving_early_is_a_divergence_naming_its_shutdown(how):
    """Input (2 simulated ranks): rank 1's program returns (or calls q.shutdown()) right
    away while rank 0 submits a kernel and fences.  Expected: cl.DivergenceError: rank 1
    submitted its shutdown epoch where rank 0 submitted the kernel 'step'."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")
        if rank == 1:
            if how == "shuts_down":
                q.shutdown()
            return None
        q.submit(_touch(b, "step"))
        return q.fence(b).result(timeout=30)

    with pytest.raises(cl.DivergenceError) as ei:
        run_cluster(program, nodes=2, timeout=60, CELERITAS_DEVICES="host:1", CELERITAS_DIVERGENCE_TIMEOUT="20")
    msg = str(ei.value)
    assert "rank 1 submitted T1 (shutdown epoch" in msg and "rank 0 submitted T1 (device_compute 'step'" in msg


@pytest.mark.parametrize("rank1, expected", [
    (None, "rank 1 submitted buffer B1 float64 of shape (4,) (made before T1)|rank 0 submitted no further task"),
    (np.float32, "rank 1 submitted buffer B1 float32 of shape (4,)"),
    ((2, 2), "rank 1 submitted buffer B1 float64 of shape (2, 2)"),
])
def test_a_buffer_made_on_one_rank_only_or_differing_is_a_divergence(rank1, expected):
    """Input (2 simulated ranks): after a shared buffer, rank 1 alone makes a buffer (or its
    buffer has dtype float32 / shape (2, 2) where rank 0's is float64 (4,)); both wait.
    Expected: cl.DivergenceError naming the buffer, its dtype and shape on rank 1."""
    def program(rank):
        q = cl.Queue()
        cl.Buffer(np.arange(16.0), name="b")
        if rank == 0 and rank1 is not None:
            _keep = cl.Buffer(np.zeros(4), name="c")
        elif rank == 1:
            if rank1 is None:
                _keep = cl.Buffer(np.zeros(4), name="c")
            elif isinstance(rank1, tuple):
                _keep = cl.Buffer(np.zeros(rank1), name="c")
            else:
                _keep = cl.Buffer(np.zeros(4, dtype=rank1), name="c")
        q.wait()
        return rank

    # (each part on its own: the error run_cluster raises is either rank's, which name the two
    # ranks in either order)
    with pytest.raises(cl.DivergenceError) as ei:
        run_cluster(program, nodes=2, timeout=60, CELERITAS_DEVICES="host:1", CELERITAS_DIVERGENCE_TIMEOUT="20")
    for part in expected.split("|"):
        assert part in str(ei.value), str(ei.value)


def test_a_kernel_slow_on_one_rank_is_no_divergence():
    """Input (2 simulated ranks, default divergence timeout): rank 1's chunk of a kernel
    sleeps 1.5 s, then both fence and wait with barrier=True.  Expected: both ranks get the
    right result; no DivergenceError."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")

        def cgf(cgh):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)

            def kernel(chunk):
                if q.rank == 1:
                    time.sleep(1.5)
                w[chunk] = w[chunk] * 2
            cgh.parallel_for((16,), kernel, name="slow")

        q.submit(cgf)
        total = float(q.fence(b).result(timeout=30).sum())
        q.wait(barrier=True)
        return total

    assert run_cluster(program, nodes=2, timeout=60, CELERITAS_DEVICES="host:1") == [240.0, 240.0]


@pytest.mark.parametrize("var", ["CELERITAS_TRACE", "CELERITAS_PRINT_GRAPHS", "CELERITAS_SUMMARY"])
def test_shutdown_outputs_never_hide_a_ranks_own_failure(tmp_path, var):
    """Input (2 simulated ranks) with CELERITAS_TRACE=<file> / CELERITAS_PRINT_GRAPHS=<folder>
    / CELERITAS_SUMMARY=1: a kernel that raises on rank 1.  Expected: the cl.KernelError
    naming the kernel and rank 1 surfaces (the collective output writing neither hangs nor
    replaces it)."""
    value = {"CELERITAS_TRACE": str(tmp_path / "t.json"), "CELERITAS_PRINT_GRAPHS": str(tmp_path / "graphs"),
             "CELERITAS_SUMMARY": "1"}[var]

    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")

        def cgf(cgh):
            b.access(cgh, cl.one_to_one(), cl.read_write)

            def kernel(chunk):
                if q.rank == 1:
                    raise ValueError("kernel fails on rank 1")
            cgh.parallel_for((16,), kernel, name="bad")

        q.submit(cgf)
        return q.fence(b).result(timeout=30)

    with pytest.raises(cl.KernelError, match=r"kernel 'bad' of task T\d+ failed on rank 1"):
        run_cluster(program, nodes=2, timeout=60, CELERITAS_DEVICES="host:1", **{var: value})
