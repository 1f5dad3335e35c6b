"""cluster/ (scaling harness, dry-run study, Slurm templates) and benchmarks/run_all."""
import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import dry_run, scaling, workloads

ROOT = Path(__file__).resolve().parents[1]


def _has_mpiexec() -> bool:
    try:
        import mpi4py  # noqa: F401
        from celeritas import launcher
        return launcher.find_mpiexec() is not None
    except Exception:  # noqa: BLE001
        return False


def _png(path: Path) -> bool:
    return path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- scaling harness ---------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.skipif(not _has_mpiexec(), reason="needs mpi4py and an mpiexec")
def test_scaling_harness_writes_csv_and_png_through_mpiexec(tmp_path):
    rc = scaling.main(["--app", "wave_sim", "--ranks", "1,2", "--size", "48", "--steps", "4",
                       "--devices", "host:1", "--launcher", "mpiexec", "--timeout", "120", "--out", str(tmp_path)])
    assert rc == 0
    rows = list(csv.DictReader((tmp_path / "wave_sim_strong.csv").open()))
    # celeritas and, beside it, wave_sim's hand-written mpi4py baseline at every point
    assert [(r["impl"], int(r["ranks"])) for r in rows] == [("celeritas", 1), ("mpi4py", 1),
                                                              ("celeritas", 2), ("mpi4py", 2)]
    assert all(float(r["seconds"]) > 0 for r in rows)
    for first in rows[:2]:        # each implementation against its own time on one rank
        assert float(first["speedup"]) == pytest.approx(1.0) and float(first["efficiency"]) == pytest.approx(1.0)
    assert _png(tmp_path / "wave_sim_strong.png")


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.skipif(not _has_mpiexec(), reason="needs mpi4py and an mpiexec")
def test_weak_scaling_of_a_new_app_grows_the_size(tmp_path):
    rc = scaling.main(["--app", "rsim", "--ranks", "1,2", "--size", "32", "--steps", "6", "--weak",
                       "--launcher", "mpiexec", "--timeout", "120", "--out", str(tmp_path), "--name", "weak"])
    assert rc == 0
    rows = scaling.read_csv(tmp_path / "weak.csv")
    assert [r["size"] for r in rows] == [32, 45]               # 32 * sqrt(2): work per rank is constant
    assert [r["impl"] for r in rows] == ["celeritas", "celeritas"]    # rsim has no hand-written baseline
    assert rows[1]["ranks"] == 2 and rows[1]["mode"] == "weak"
    assert _png(tmp_path / "weak.png")


def test_speedup_and_efficiency_arithmetic():
    strong = [{"app": "a", "mode": "strong", "ranks": r, "seconds": t} for r, t in ((2, 8.0), (4, 4.0), (8, 4.0))]
    scaling.add_speedup(strong)
    assert [r["speedup"] for r in strong] == [2.0, 4.0, 4.0]
    assert [r["efficiency"] for r in strong] == [1.0, 1.0, 0.5]
    both = [{"app": "a", "impl": i, "mode": "strong", "ranks": r, "seconds": t}
            for i, r, t in (("celeritas", 1, 8.0), ("mpi4py", 1, 4.0), ("celeritas", 2, 8.0), ("mpi4py", 2, 2.0))]
    scaling.add_speedup(both)      # each implementation against its own one-rank time
    assert [r["efficiency"] for r in both] == [1.0, 1.0, 0.5, 1.0]
    weak = [{"app": "a", "mode": "weak", "ranks": r, "seconds": t} for r, t in ((1, 2.0), (4, 4.0))]
    scaling.add_speedup(weak)
    assert weak[1]["efficiency"] == 0.5 and weak[1]["speedup"] == 2.0


def test_weak_sizes_follow_the_work_exponent():
    assert workloads.get("wave_sim").weak_size(100, 4) == 200
    assert workloads.get("jacobi3d").weak_size(100, 8) == 200
    assert workloads.get("matmul").weak_size(64, 1) == 64


def test_launcher_choice_and_srun_command():
    assert scaling.choose_launcher("auto", {"SLURM_JOB_ID": "42"}) == "srun"
    assert scaling.choose_launcher("auto", {}) == "mpiexec"
    assert scaling.choose_launcher("srun", {}) == "srun"
    argv, env = scaling.build_command("srun", 8, ["--app", "nbody"], devices="cuda", extra=["--gpus-per-task=1"])
    assert argv[:4] == ["srun", "-n", "8", "--gpus-per-task=1"]
    assert argv[4:] == [sys.executable, "-m", "cluster.run_app", "--app", "nbody"]
    assert env["CELERITAS_DEVICES"] == "cuda" and str(ROOT) in env["PYTHONPATH"]


def test_open_mpi_gets_root_and_oversubscribe_flags(monkeypatch):
    from celeritas import launcher
    monkeypatch.setattr(launcher, "find_mpiexec", lambda explicit=None: "/usr/bin/mpiexec")
    monkeypatch.setattr(launcher, "detect", lambda path, timeout=15.0: launcher.Mpiexec(path, launcher.OPENMPI,
                                                                                        "mpiexec (Open MPI) 4.1"))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    argv, _ = scaling.build_command("mpiexec", 4, ["--app", "wave_sim"])
    assert argv[:3] == ["/usr/bin/mpiexec", "-n", "4"]
    assert "--allow-run-as-root" in argv and "--oversubscribe" in argv


def test_timing_line_is_found_among_other_output():
    out = "some banner\n{not json\n{\"app\": \"x\", \"seconds\": 1.5}\nwave_sim 64x64: 0.1 s\n"
    assert scaling.parse_timing(out) == {"app": "x", "seconds": 1.5}
    assert scaling.parse_timing("nothing here") is None


def test_run_app_measures_in_process(capsys):
    from cluster import run_app
    assert run_app.main(["--app", "jacobi3d", "--size", "10", "--steps", "3", "--devices", "host:2"]) == 0
    rec = scaling.parse_timing(capsys.readouterr().out)
    assert rec["app"] == "jacobi3d" and rec["ranks"] == 1 and rec["devices"] == 2 and rec["steps"] == 3


# ---- dry run ---------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_dry_run_study_writes_csv_and_png(tmp_path):
    assert dry_run.main(["--nodes", "1,4,16", "--size", "64", "--steps", "4", "--repeats", "1",
                         "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "dry_run_wave_sim.csv").open()))
    assert [int(r["nodes"]) for r in rows] == [1, 4, 16]
    assert all(float(r["scheduler_us_per_task"]) > 0 and int(r["tasks"]) >= 4 for r in rows)
    assert _png(tmp_path / "dry_run_wave_sim.png")
    assert "CELERITAS_DRY_RUN_NODES" not in os.environ


# ---- Slurm templates ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rank_per_node", "rank_per_gpu", "scaling"])
def test_slurm_templates_are_valid_bash_using_srun(name):
    path = ROOT / "cluster" / "slurm" / f"{name}.sbatch"
    text = path.read_text()
    assert text.startswith("#!/bin/bash") and "#SBATCH" in text and "srun" in text
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


# ---- benchmarks --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_run_all_quick_end_to_end(tmp_path):
    md = tmp_path / "bench.md"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run_all", "--quick", "--markdown", str(md)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = md.read_text()
    for section in ("scheduler", "runtime", "stencil", "apps", "lookahead", "mpi", "gpu"):
        assert f"| {section} |" in table
    # the interpreter's pace before and after every section (a shared VM changes speed)
    pace = re.search(r"Machine pace \(ms for 2,000,000 additions[^)]*\): (.*)\.\n", table)
    assert pace, table[:2000]
    paces = dict(re.findall(r"(\w+) (\d+)/\d+", pace.group(1)))
    assert set(paces) == {"scheduler", "executor", "runtime", "stencil", "apps", "lookahead", "mpi", "device", "gpu"}
    assert all(int(v) > 0 for v in paces.values())
    assert "RESULTS DIFFER" not in table
    # the MPI wave_sim rows carry the median of each repetition's own ratio beside the best-of one
    wave_rows = [ln for ln in table.splitlines() if ln.startswith("| mpi | wave_sim")]
    assert wave_rows and all("median of the repetitions' own ratios:" in ln for ln in wave_rows), wave_rows
    assert "dask map_overlap" in table
