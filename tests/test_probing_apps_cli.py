"""Adversarial probes of the apps' and the cluster tools' command lines, and of the docs' commands.

A third probing round (after tests/test_api_probing.py and test_probing_config_cli_ranks.py):
every app of ``apps/`` (``python -m apps.NAME``) with bad option values (zero, negative and
non-numeric sizes, nan, sizes too small for the app, sizes too large for memory, unknown
options, a device list with a typo), output options pointing at folders, files with no picture
extension and paths under a file, ``--verify`` against a wrong reference, and all of them on two
MPI ranks against their numpy references; ``python -m celeritas run`` and ``info``; the cluster
tools (``cluster.scaling``, ``run_app``, ``workloads``, ``dry_run``) with bad ranks, sizes,
repeats, timeouts and app lists, and the CSV the harness writes; the Slurm templates (run by
bash with ``srun`` and ``python`` stubbed); and every command line shown in README.md and docs/.

The project rule: a bad option is a usage error (exit 2) naming it, before anything is
computed; a failure during the run is one line on stderr and a nonzero exit, never a bare
traceback, a silently ignored option or a result that --verify does not check.

The first group are the defects found, each asserting what the rule requires (its docstring
gives the input, what happened and what should; all are fixed now).  The second group pins
probes that already behave well and are not pinned elsewhere (tests/test_apps.py,
test_cluster.py, test_cli.py, test_docs.py, test_mpi.py).
"""
from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
from jobs import (
    HAVE_MPI4PY,
    MPIEXEC,
    ROOT,
    clean_env,
    explain,
    job_or_none,
    needs_mpi,
)

import celeritas as cl
from celeritas.__main__ import main as celeritas_main

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("clean_environment")]

APPS = ["hello", "wave_sim", "matmul", "convolution", "reduction", "nbody", "jacobi3d", "rsim"]
TIMED = ["convolution", "reduction", "nbody", "jacobi3d", "rsim"]      # the apps with --json/--no-progress
# a small run of each app, for the probes that start one
SMALL = {"hello": [], "wave_sim": ["-N", "24", "-T", "3"], "matmul": ["-N", "16"],
         "convolution": ["-N", "20", "--output", ""], "reduction": ["-N", "20"], "nbody": ["-N", "16", "-T", "2"],
         "jacobi3d": ["-N", "8", "-T", "6"], "rsim": ["-N", "12", "-T", "5"]}




_env = clean_env


def _job(argv: list, env: dict | None = None, timeout: float = 60, cwd=None):
    return job_or_none(argv, _env(env), timeout, cwd=cwd or ROOT)


def _app(name: str):
    return importlib.import_module(f"apps.{name}")


def _usage_error(capsys, main, argv: list) -> str:
    """``main(argv)`` must stop at the option parsing with exit status 2; its stderr."""
    with pytest.raises(SystemExit) as ei:
        main(argv)
    err = capsys.readouterr().err
    assert ei.value.code == 2, f"exit {ei.value.code}\n{err}"
    return " ".join(err.split())


class _Parsed(Exception):
    """Raised by the patched ``parse_args`` once a command line parsed: nothing runs after it."""

    def __init__(self, parser: argparse.ArgumentParser, args: argparse.Namespace):
        super().__init__(parser.prog)
        self.parser, self.namespace = parser, args


def _parse_only(monkeypatch, module: str, argv: list) -> _Parsed:
    """Parse ``python -m module argv`` with the module's own parser, without running it: a usage
    error fails the probe with argparse's message."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        ns = original(self, args, namespace)
        raise _Parsed(self, ns)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    mod = importlib.import_module(module if module != "celeritas" else "celeritas.__main__")
    try:
        mod.main(list(argv))
    except _Parsed as done:
        return done
    except SystemExit as exc:
        pytest.fail(f"python -m {module} {shlex.join(argv)}: usage error (exit {exc.code})")
    finally:
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", original)
    pytest.fail(f"python -m {module} {shlex.join(argv)}: its main() returned without parsing")


# =====================================================================================
# Defects found by probing: each asserts what the rule requires
# =====================================================================================


@pytest.mark.parametrize("name", APPS)
def test_an_app_with_a_device_list_typo_is_a_usage_error(name, capsys):
    """Input: python -m apps.NAME --devices host:0 (or bogus).  Happened: every app started,
    and cl.Queue raised scheduler.errors.ConfigError with a 12-line traceback (under mpiexec on
    every rank).  Expected: a usage error (exit 2) naming --devices, before anything runs."""
    err = _usage_error(capsys, _app(name).main, ["--devices", "host:0"])
    assert "argument --devices" in err and "host:N needs 1 <= N <= 64" in err, err
    assert "is not a device list" in _usage_error(capsys, _app(name).main, ["--devices", "gpu"])


@pytest.mark.parametrize("name", APPS)
def test_every_app_option_has_a_help_line(name, monkeypatch):
    """Input: python -m apps.NAME --help.  Happened: wave_sim's and nbody's -T, matmul's -N,
    --split-2d and --repeat, wave_sim's --output-every, convolution's --sigma, jacobi3d's
    --check-every, every app's --lookahead and --no-progress showed no text at all (nothing
    said -T counts time steps or that --output-every needs --output).  Expected: every option
    says what it does."""
    parser = _parse_only(monkeypatch, f"apps.{name}", []).parser
    for action in parser._actions:
        if action.option_strings:
            assert action.help, f"apps.{name} {action.option_strings}: no help text"


def test_a_size_too_large_for_memory_is_one_line_not_a_traceback():
    """Input: python -m apps.wave_sim -N 1000000 -T 1 (a 4 TB grid).  Happened: numpy's
    _ArrayMemoryError traceback from initial_condition (exit 1).  Expected: one line saying the
    run is out of host memory, how much it asked for and to try a smaller -N."""
    r = _job([sys.executable, "-m", "apps.wave_sim", "-N", "1000000", "-T", "1"])
    assert r is not None and r.returncode == 1, explain(r)
    assert "Traceback" not in r.stderr, explain(r)
    assert re.search(r"error: out of host memory \(Unable to allocate [\d.]+ TiB.*\); try a smaller -N", r.stderr)


@needs_mpi
def test_an_app_failing_on_two_ranks_ends_the_job_with_one_line_per_rank():
    """Input: mpiexec -n 2 python -m apps.wave_sim -N 1000000 (every rank runs out of host
    memory).  Happened: each rank printed numpy's traceback, then celeritas' excepthook
    aborted the job.  Expected: the job still ends (nonzero, within seconds), with one
    'error: out of host memory' line per rank and no traceback."""
    r = _job([MPIEXEC, "-n", "2", sys.executable, "-m", "apps.wave_sim", "-N", "1000000"], timeout=60)
    assert r is not None and r.returncode != 0, explain(r)
    assert r.stderr.count("error: out of host memory") == 2 and "Traceback" not in r.stderr, explain(r)


def test_a_celeritas_error_while_an_app_runs_is_one_line_not_a_traceback():
    """Input: CELERITAS_HORIZON_STEP=0 python -m apps.hello (an invalid setting, found by
    cl.Queue()).  Happened: a traceback through apps/hello.py, celeritas/runtime.py and
    config.py ending in scheduler.errors.ConfigError.  Expected: ``error: ConfigError: ...``
    naming the variable on one line, exit status 1."""
    r = _job([sys.executable, "-m", "apps.hello"], {"CELERITAS_HORIZON_STEP": "0"})
    assert r is not None and r.returncode == 1, explain(r)
    assert "Traceback" not in r.stderr and "error: ConfigError: CELERITAS_HORIZON_STEP" in r.stderr, explain(r)


def test_wave_sim_output_alone_writes_the_last_frame(tmp_path, capsys):
    """Input: python -m apps.wave_sim -N 24 -T 3 --output DIR (no --output-every).  Happened:
    exit 0 and nothing written, not even DIR (--output-every defaulted to 0: no frame).
    Expected: DIR/frame_00003.npy holding the final field (the numpy reference's)."""
    from apps import wave_sim
    assert wave_sim.main(["-N", "24", "-T", "3", "--output", str(tmp_path / "frames")]) == 0
    assert sorted(p.name for p in (tmp_path / "frames").iterdir()) == ["frame_00003.npy"]
    np.testing.assert_array_equal(np.load(tmp_path / "frames" / "frame_00003.npy"), wave_sim.reference(24, 3))
    # every --output-every steps, and the last step once
    assert wave_sim.main(["-N", "24", "-T", "5", "--output", str(tmp_path / "f2"), "--output-every", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "f2").iterdir()) == [
        "frame_00002.npy", "frame_00004.npy", "frame_00005.npy"]


def test_wave_sim_output_every_without_output_is_a_usage_error(capsys):
    """Input: python -m apps.wave_sim --output-every 5.  Happened: the option was silently
    ignored (no folder to write to).  Expected: a usage error saying it needs --output."""
    from apps import wave_sim
    assert "--output-every needs --output" in _usage_error(capsys, wave_sim.main, ["--output-every", "5"])


def test_an_output_that_is_a_folder_is_a_usage_error(tmp_path, capsys):
    """Input: python -m apps.convolution --output DIR (an existing folder; reduction likewise),
    and wave_sim --output FILE (an existing file).  Happened: the whole computation ran, then
    rank 0's write_png host task failed: a KernelError traceback ending in 'ValueError:
    unknown file extension' (exit 1); wave_sim's frame task failed the same way.  Expected: a
    usage error naming the path, before anything is computed."""
    from apps import convolution, reduction, wave_sim
    for main in (convolution.main, reduction.main):
        assert "is a folder; give a file name" in _usage_error(capsys, main, ["--output", str(tmp_path)])
    (tmp_path / "f").write_text("")
    assert "is a file, not a folder" in _usage_error(capsys, wave_sim.main, ["--output", str(tmp_path / "f")])


def test_an_output_without_a_picture_extension_or_under_a_file_is_a_usage_error(tmp_path, capsys):
    """Input: python -m apps.convolution --output out.txt, and --output FILE/sub/x.png (FILE an
    existing file).  Happened: the run completed, then a KernelError traceback from the PNG
    host task ('unknown file extension: .txt'; 'Not a directory').  Expected: usage errors."""
    from apps import convolution
    err = _usage_error(capsys, convolution.main, ["--output", str(tmp_path / "out.txt")])
    assert "has no picture extension" in err, err
    (tmp_path / "file").write_text("")
    err = _usage_error(capsys, convolution.main, ["--output", str(tmp_path / "file" / "sub" / "x.png")])
    assert "is a file, not a folder" in err, err


def test_a_missing_input_picture_is_a_usage_error(tmp_path, capsys):
    """Input: python -m apps.convolution --input missing.png.  Happened: a FileNotFoundError
    traceback from PIL.Image.open.  Expected: a usage error naming the file."""
    from apps import convolution
    err = _usage_error(capsys, convolution.main, ["--input", str(tmp_path / "missing.png")])
    assert "no such file" in err and "missing.png" in err, err


@pytest.mark.parametrize("sigma", ["0", "-1", "nan"])
def test_a_gaussian_width_that_is_not_positive_is_a_usage_error(sigma, capsys):
    """Input: python -m apps.convolution --sigma 0 --verify (-1, nan likewise).  Happened:
    --sigma 0 divided by zero: NaN weights, a picture of NaNs cast to uint8 (RuntimeWarnings)
    and still 'verified against numpy' (the reference made the same NaNs); --sigma -1 ran as
    +1.  Expected: a usage error: the width must be above 0."""
    from apps import convolution
    err = _usage_error(capsys, convolution.main, ["--sigma", sigma])
    assert "argument --sigma" in err and ("must be above 0" in err or "finite" in err), err


@pytest.mark.parametrize("size", ["1", "2"])
def test_a_jacobi_cube_without_an_interior_is_a_usage_error(size, capsys):
    """Input: python -m apps.jacobi3d -N 1 (-N 2).  Happened: a CeleritasError traceback 'global
    range (-1, -1, -1) must have 0 to 3 non-negative extents' (-N 1), and with -N 2 --verify a
    numpy ValueError 'zero-size array to reduction operation maximum' in the reference.
    Expected: a usage error: the edge (boundary included) must be at least 3."""
    from apps import jacobi3d
    assert "argument -N/--size: must be at least 3" in _usage_error(capsys, jacobi3d.main, ["-N", size])


@pytest.mark.parametrize("name, option", [("nbody", "--dt"), ("jacobi3d", "--tol")])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_float_option_is_a_usage_error(name, option, value, capsys):
    """Input: python -m apps.nbody --dt nan --verify (jacobi3d --tol nan; inf likewise).
    Happened: nbody ran and printed 'kinetic energy nan' and 'mismatch: max position error
    nan'; jacobi3d never converged (every comparison with nan is false) and said nothing.
    Expected: a usage error: a finite number."""
    err = _usage_error(capsys, _app(name).main, [option, value])
    assert f"argument {option}: must be a finite number" in err, err


@pytest.mark.parametrize("argv, words", [
    (["--repeats", "0"], "argument --repeats: must be at least 1"),
    (["--size", "0"], "argument --size: must be at least 1"),
    (["--steps", "0"], "argument --steps: must be at least 1"),
    (["--timeout", "0"], "argument --timeout: must be above 0"),
    (["--devices", "host:0"], "argument --devices"),
    (["--app", ""], "argument --app: name one or more"),
    (["--app", ","], "argument --app: name one or more"),
    (["--app", "wave_sim,bogus"], "argument --app: unknown app 'bogus'"),
])
def test_scaling_harness_bad_arguments_are_usage_errors(argv, words, capsys):
    """Input: python -m cluster.scaling --repeats 0 (and --size 0, --steps 0, --timeout 0,
    --devices host:0, --app '' / ',' / 'wave_sim,bogus').  Happened: --repeats 0 ended in a
    statistics.StatisticsError traceback ('no median for empty data'); --size 0 / --steps 0
    timed empty runs and wrote CSV rows of size 0 (exit 0); --timeout 0 failed every job;
    --devices host:0 a ConfigError traceback; --app '' wrote an empty '_strong.csv' (exit 0);
    an unknown app exited 1 with a bare message.  Expected: usage errors (exit 2) naming the
    option, before any job starts."""
    from cluster import scaling
    err = _usage_error(capsys, scaling.main, ["--ranks", "1", *argv])
    assert words in err, err


@pytest.mark.parametrize("module, argv, words", [
    ("cluster.run_app", ["--app", "wave_sim", "--size", "0"], "argument --size: must be at least 1"),
    ("cluster.run_app", ["--app", "wave_sim", "--steps", "-1"], "argument --steps: must be at least 1"),
    ("cluster.run_app", ["--app", "wave_sim", "--devices", "host:99"], "argument --devices"),
    ("cluster.workloads", ["--handwritten", "nbody", "--size", "0"], "argument --size: must be at least 1"),
    ("cluster.dry_run", ["--steps", "0"], "argument --steps: must be at least 1"),
    ("cluster.dry_run", ["--repeats", "0"], "argument --repeats: must be at least 1"),
    ("cluster.dry_run", ["--app", "bogus"], "argument --app: unknown app 'bogus'"),
    ("cluster.dry_run", ["--devices", "hots:2"], "argument --devices"),
])
def test_cluster_tools_bad_sizes_and_apps_are_usage_errors(module, argv, words, capsys):
    """Input: python -m cluster.run_app --app wave_sim --size 0 (--steps -1, --devices host:99),
    cluster.workloads --handwritten nbody --size 0, cluster.dry_run --steps 0 / --repeats 0 /
    --app bogus / --devices hots:2.  Happened: run_app and workloads timed empty or negative
    runs and printed a timing record (exit 0); dry_run --app bogus exited 1 with a bare message,
    --devices a ConfigError traceback from the first point.  Expected: usage errors."""
    err = _usage_error(capsys, importlib.import_module(module).main, argv)
    assert words in err, err


# =====================================================================================
# Probes that pass: options, --verify, multi-rank results, CLI, harness, templates, docs
# =====================================================================================


@pytest.mark.parametrize("name", APPS[1:])
@pytest.mark.parametrize("argv, words", [
    (["-N", "0"], "must be at least"),
    (["-N", "-5"], "must be at least"),
    (["-N", "abc"], "'abc' is not an integer"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--lookahead", "sometimes"], "invalid choice: 'sometimes'"),
])
def test_app_bad_sizes_and_unknown_options_are_usage_errors(name, argv, words, capsys):
    assert words in _usage_error(capsys, _app(name).main, argv)


@pytest.mark.parametrize("name", APPS)
def test_app_help_lists_the_options_the_docs_promise(name, capsys, monkeypatch):
    """docs/cluster.md: all apps take --devices, --lookahead, --verify; the five timed apps also
    --json and --no-progress; every option of an app with a value has a help line."""
    with pytest.raises(SystemExit) as ei:
        _app(name).main(["--help"])
    assert ei.value.code == 0
    text = capsys.readouterr().out
    for option in ("--devices", "--lookahead", "--verify"):
        assert option in text, (name, option)
    assert ("--json" in text and "--no-progress" in text) == (name in TIMED), name


def test_docs_say_which_apps_are_timed():
    text = (ROOT / "docs" / "cluster.md").read_text()
    assert "the five below also `--json`" in text and len(TIMED) == 5
    table = re.findall(r"^\| `apps\.(\w+)` \|", text, re.M)
    assert sorted(table) == sorted(APPS[1:]), table


_WRONG = {   # name -> (attribute of the module to patch, a wrapper that makes its answer wrong)
    "hello": ("run", lambda f: lambda q, *a, **k: f(q, *a, **k).lower()),
    "wave_sim": ("reference", lambda f: lambda *a, **k: f(*a, **k) + np.float32(1e-3)),
    "matmul": ("run", lambda f: lambda *a, **k: f(*a, **k) + 1),
    "convolution": ("reference", lambda f: lambda *a, **k: f(*a, **k) ^ np.uint8(1)),
    "reduction": ("reference", lambda f: lambda *a, **k: (lambda r: (r[0] + 1, r[1], r[2]))(f(*a, **k))),
    "nbody": ("reference", lambda f: lambda *a, **k: (lambda r: (r[0] * (1 + 1e-7), r[1]))(f(*a, **k))),
    "jacobi3d": ("reference", lambda f: lambda *a, **k: (lambda r: r._replace(u=r.u + 1e-3))(f(*a, **k))),
    "rsim": ("reference", lambda f: lambda *a, **k: f(*a, **k) + 1),
}


@pytest.mark.parametrize("name", APPS)
def test_verify_really_compares_with_the_reference(name, monkeypatch, capsys):
    """--verify passes on the real result and fails (exit status 1, 'mismatch' or 'wrong
    result') when the reference (or the result) is off by a little."""
    mod = _app(name)
    extra = ["--no-progress"] if name in TIMED else []
    assert mod.main(SMALL[name] + extra + ["--verify", "--devices", "host:2"]) == 0
    assert "verified" in capsys.readouterr().err
    attr, wrong = _WRONG[name]
    monkeypatch.setattr(mod, attr, wrong(getattr(mod, attr)))
    assert mod.main(SMALL[name] + extra + ["--verify"]) == 1
    err = capsys.readouterr().err
    assert "mismatch" in err or "wrong result" in err, err


_ALL_APPS_PROGRAM = '''
import json
import numpy as np
import celeritas as cl
from apps import convolution, hello, jacobi3d, matmul, nbody, reduction, rsim, wave_sim

q = cl.Queue()
out = {"ranks": q.num_ranks, "hello": hello.run(q) == "Hello, World!"}
out["wave_sim"] = bool(np.array_equal(wave_sim.run(q, 37, 7), wave_sim.reference(37, 7)))
a, b = matmul.inputs(40)
out["matmul"] = bool(np.array_equal(matmul.run(q, 40, split_2d=True), a @ b))
img = convolution.synthetic_image(40, 36)
out["convolution"] = bool(np.array_equal(convolution.run(q, img, radius=3, iterations=2),
                                         convolution.reference(img, 3, None, 2)))
res, lo, hi = reduction.run(q, 40, repeat=2)
ref, rlo, rhi = reduction.reference(reduction.low_contrast_image(40, 40, frame=1))
out["reduction"] = bool(np.array_equal(res, ref)) and (lo, hi) == (rlo, rhi)
pos, vel = nbody.run(q, 64, 3)
rp, rv = nbody.reference(64, 3)
out["nbody"] = bool(np.allclose(pos, rp, rtol=1e-9, atol=1e-12) and np.allclose(vel, rv, rtol=1e-9, atol=1e-12))
jr, jref = jacobi3d.run(q, 12, 40, tol=1e-3, check_every=5), jacobi3d.reference(12, 40, 1e-3, 5)
out["jacobi3d"] = bool(np.array_equal(jr.u, jref.u)) and jr.steps == jref.steps
out["rsim"] = bool(np.array_equal(rsim.run(q, 24, 12), rsim.reference(24, 12)))
rank = q.rank
q.shutdown()
if rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
'''


@needs_mpi
def test_every_app_on_two_ranks_matches_its_reference_bitwise_where_the_docs_say_so(tmp_path):
    """docs/cluster.md: convolution, reduction, jacobi3d, rsim, wave_sim and matmul are
    bit-identical to numpy on any rank and device count, nbody within rtol 1e-9.  Checked on
    2 MPI ranks x 2 host devices (odd sizes, split_2d, a radius-3 blur, a converging jacobi)."""
    script = tmp_path / "all_apps.py"
    script.write_text(_ALL_APPS_PROGRAM)
    r = _job([MPIEXEC, "-n", "2", sys.executable, script], {"CELERITAS_DEVICES": "host:2"}, timeout=120)
    assert r is not None and r.returncode == 0, explain(r)
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    out = json.loads(line[len("RESULT "):])
    assert out.pop("ranks") == 2 and all(out.values()), out


@needs_mpi
def test_celeritas_run_of_an_app_verifies_on_two_ranks_and_prints_once():
    """The README's `python -m celeritas run -n 4 --devices host:2 -m apps.wave_sim ...` at a
    small size on 2 ranks: exit 0, one summary line and one verdict (rank 0 only)."""
    r = _job([sys.executable, "-m", "celeritas", "run", "-n", "2", "--devices", "host:2", "-m", "apps.wave_sim",
              "-N", "40", "-T", "6", "--verify"], timeout=90)
    assert r is not None and r.returncode == 0, explain(r)
    assert r.stderr.count("verified against numpy") == 1 and r.stderr.count("on 2 rank(s)") == 1, explain(r)


@needs_mpi
def test_celeritas_run_propagates_exit_codes_and_missing_programs(tmp_path):
    (tmp_path / "exit7.py").write_text("import sys\nsys.exit(7)\n")
    (tmp_path / "raise.py").write_text("raise ValueError('boom')\n")
    run = [sys.executable, "-m", "celeritas", "run", "-n", "2"]
    r = _job(run + [tmp_path / "exit7.py"])
    assert r is not None and r.returncode == 7, explain(r)
    r = _job(run + [tmp_path / "raise.py"])
    assert r is not None and r.returncode != 0 and "ValueError: boom" in r.stderr, explain(r)
    r = _job(run + ["-m", "apps.no_such_app"])
    assert r is not None and r.returncode != 0 and "No module named apps.no_such_app" in r.stderr, explain(r)


@pytest.mark.parametrize("argv, words", [
    (["run", "-n", "abc", "x.py"], "invalid int value: 'abc'"),
    (["run", "-n", "2", "--devices", "host:0", "--print", "x.py"], "host:N needs 1 <= N <= 64"),
])
def test_celeritas_run_bad_rank_counts_and_devices_are_errors(argv, words, capsys):
    try:
        rc = celeritas_main(argv)
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2 and words in capsys.readouterr().err


def test_celeritas_info_shows_version_mpi_and_validity(monkeypatch, capsys):
    assert celeritas_main(["info"]) == 0
    text = capsys.readouterr().out
    assert re.search(rf"version\s+│\s+{re.escape(cl.__version__)}", text), text
    assert "backends and devices" in text and "host" in text and "(none set: defaults)" in text
    if HAVE_MPI4PY:
        assert re.search(r"world size\s+│\s+1\b", text) and "thread level" in text, text
    monkeypatch.setenv("CELERITAS_DEVICES", "host:0")
    assert celeritas_main(["info"]) == 1
    assert "host:N needs 1 <= N <= 64" in " ".join(capsys.readouterr().out.replace("│", " ").split())


@pytest.mark.parametrize("ranks, words", [
    ("0,2", "needs positive rank counts"), ("a", "comma-separated list of integers"), (",", "needs positive"),
    ("1,-2", "needs positive"),
])
def test_scaling_rank_lists_are_checked(ranks, words, capsys):
    from cluster import scaling
    assert words in _usage_error(capsys, scaling.main, ["--ranks", ranks])
    assert scaling.parse_ranks("4,1,2,2") == [1, 2, 4]


@needs_mpi
def test_scaling_csv_has_the_documented_columns_and_a_png(tmp_path):
    """docs/cluster.md names the CSV's columns; a one-point study (1 rank, size 16) writes
    exactly those, in that order, with numbers that parse, and a PNG."""
    r = _job([sys.executable, "-m", "cluster.scaling", "--app", "wave_sim", "--ranks", "1", "--size", "16",
              "--steps", "2", "--no-handwritten", "--out", tmp_path, "--name", "probe"], timeout=120)
    assert r is not None and r.returncode == 0, explain(r)
    doc = (ROOT / "docs" / "cluster.md").read_text()
    documented = re.search(r"columns `([^`]+)`", doc).group(1).replace("\n", " ")
    with (tmp_path / "probe.csv").open() as f:
        header = next(csv.reader(f))
    assert header == [c.strip() for c in documented.split(",")]
    from cluster import scaling
    (row,) = scaling.read_csv(tmp_path / "probe.csv")
    assert (row["app"], row["impl"], row["ranks"], row["size"], row["steps"], row["runs"]) == \
        ("wave_sim", "celeritas", 1, 16, 2, 1)
    assert row["seconds"] > 0 and row["speedup"] == 1.0 and row["efficiency"] == 1.0
    assert (tmp_path / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- Slurm templates: run by bash with srun and python stubbed -------------------------------


def _run_template(tmp_path: Path, name: str, env: dict) -> list[list[str]]:
    """Run cluster/slurm/NAME with bash; ``srun`` and ``python`` are stubs that record their
    arguments.  Returns the command lines the template started (python's, without 'python')."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    log = tmp_path / "calls"
    (venv / "activate").write_text(
        f'python() {{ printf "%s\\0" python "$@" >> {log}; printf "\\n" >> {log}; }}\n'
        f'srun() {{ while [ "$1" != python ]; do shift; done; shift; python "$@"; }}\n')
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "VENV": str(tmp_path / "venv"),
            "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_ID": "4242"}
    r = _job(["bash", ROOT / "cluster" / "slurm" / name], {**base, **env}, timeout=30)
    assert r is not None and r.returncode == 0, explain(r)
    calls = [c.split("\0")[1:-1] for c in log.read_text().split("\n") if c]
    assert calls, f"{name} started no python"
    return calls


@pytest.mark.parametrize("name, env", [
    ("rank_per_node.sbatch", {}),
    ("rank_per_node.sbatch", {"APP": "apps.jacobi3d", "ARGS": "-N 512 -T 500"}),
    ("rank_per_gpu.sbatch", {}),
    ("rank_per_gpu.sbatch", {"APP": "apps.nbody", "ARGS": "-N 65536 -T 20"}),
    ("scaling.sbatch", {}),
    ("scaling.sbatch", {"APPS": "wave_sim,jacobi3d", "RANKS": "1,2,4,8,16", "WEAK": "1"}),
    ("scaling.sbatch", {"SIZE": "4096", "STEPS": "20", "SRUN_MPI": "--mpi=pmi2"}),
])
def test_slurm_templates_start_commands_their_targets_accept(name, env, tmp_path, monkeypatch):
    """The templates' default commands and the examples in their headers and in docs/cluster.md
    parse with the target module's own options (no Slurm here: srun and python are stubs)."""
    for argv in _run_template(tmp_path, name, env):
        assert argv[0] == "-m", argv
        parsed = _parse_only(monkeypatch, argv[1], argv[2:])
        if argv[1] == "cluster.scaling":
            assert parsed.namespace.launcher == "srun" and parsed.namespace.out == "scaling-results/4242"
            assert parsed.namespace.weak == (env.get("WEAK") == "1")
            assert "--gpus-per-task=1" in parsed.namespace.launcher_args.split()


# ---- the docs' command lines -----------------------------------------------------------------

_DOCS = ["README.md", "docs/cluster.md", "docs/graphs.md", "docs/benchmarks.md", "docs/api.md"]
_BASH = re.compile(r"^```bash\n(.*?)^```$", re.S | re.M)


def _doc_commands() -> list[tuple[str, str]]:
    """(doc:line, command) of every ``python -m MODULE ...`` in the docs' bash blocks (without
    usage synopses in [brackets], pip and pytest)."""
    found = []
    for doc in _DOCS:
        text = (ROOT / doc).read_text()
        for m in _BASH.finditer(text):
            first = text.count("\n", 0, m.start()) + 2
            lines = m.group(1).split("\n")
            i = 0
            while i < len(lines):
                line, at = lines[i], i
                while line.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line.rstrip()[:-1] + " " + lines[i]
                i += 1
                line = line.split(" #")[0].strip()
                for part in re.split(r"&&|\)|\(", line):
                    cmd = re.search(r"python3? -m (\S+)(.*)", part)
                    if cmd and "[" not in part and cmd.group(1) not in ("pytest", "pip", "venv"):
                        found.append((f"{doc}:{first + at}", f"{cmd.group(1)}{cmd.group(2)}".strip()))
    return found


DOC_COMMANDS = _doc_commands()


def test_the_docs_show_commands_of_apps_cluster_tools_and_celeritas():
    modules = {c.split()[0] for _, c in DOC_COMMANDS}
    assert {"apps.wave_sim", "apps.hello", "celeritas", "cluster.scaling", "cluster.dry_run"} <= modules, modules
    assert len(DOC_COMMANDS) >= 15


@pytest.mark.parametrize("where, command", DOC_COMMANDS, ids=[w for w, _ in DOC_COMMANDS])
def test_every_command_in_the_docs_parses_with_its_target(where, command, monkeypatch):
    """Each ``python -m MODULE ARGS`` shown parses with MODULE's own argparse (nothing runs);
    for ``python -m celeritas run ... -m MODULE ARGS`` the program's arguments too."""
    module, *argv = shlex.split(command)
    parsed = _parse_only(monkeypatch, module, argv)
    if module == "celeritas" and argv[0] == "run":
        from celeritas.__main__ import split_run_argv
        _own, target, is_module, rest = split_run_argv(argv[1:])
        if is_module:
            _parse_only(monkeypatch, target, rest)
    assert parsed.namespace is not None


@pytest.mark.parametrize("doc, module", [("docs/cluster.md", "cluster.scaling"),
                                         ("docs/cluster.md", "cluster.dry_run")])
def test_usage_synopses_in_the_docs_name_existing_options(doc, module, monkeypatch):
    """The bracketed synopses (`python -m cluster.scaling --app ... [--devices ...] ...`): every
    option they show exists in the tool's parser."""
    text = (ROOT / doc).read_text()
    start = text.index(f"python -m {module} [") if f"python -m {module} [" in text else \
        text.index(f"python -m {module} --app wave_sim --ranks")
    synopsis = text[start:text.index("```", start)]
    shown = set(re.findall(r"(--[a-z][a-z0-9-]*)", re.sub(r"'[^']*'", "", synopsis)))   # (not quoted values)
    parser = _parse_only(monkeypatch, module, []).parser
    known = {s for a in parser._actions for s in a.option_strings}
    assert shown and shown <= known, sorted(shown - known)


def test_docs_graph_example_with_hello_writes_the_dumps_it_names(tmp_path):
    """README/graphs.md: `CELERITAS_PRINT_GRAPHS=graphs python -m apps.hello` writes the task,
    command and instruction graphs (.dot + .json) and prints Hello, World!."""
    r = _job([sys.executable, "-m", "apps.hello"], {"CELERITAS_PRINT_GRAPHS": "graphs"}, cwd=tmp_path)
    assert r is not None and r.returncode == 0 and "Hello, World!" in r.stdout, explain(r)
    names = {p.name for p in (tmp_path / "graphs").iterdir()}
    assert {"task_graph.dot", "task_graph.json", "command_graph.dot", "instruction_graph_rank0.dot"} <= names, names

