"""Choosing OpenCL devices that do not exist says so and lists the ones that do.

Run in a subprocess with ``POCL_DEVICES="pthread pthread"``: PoCL reads it when the
platforms are first enumerated, so this process's earlier OpenCL use cannot leak in,
and every PoCL platform then has exactly two devices.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyopencl")

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
import celeritas as cl
try:
    cl.Queue().shutdown()
except cl.ConfigError as exc:
    print("CONFIG_ERROR", exc)
    sys.exit(3)
print("NO ERROR")
"""


def _run(devices: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERITAS_")}
    env.update(POCL_DEVICES="pthread pthread", POCL_CACHE_DIR=str(tmp_path / "pocl"), CELERITAS_DEVICES=devices,
               PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def _platforms() -> list[str]:
    """The PoCL platform listing as the child process will see it."""
    env = dict(os.environ, POCL_DEVICES="pthread pthread")
    out = subprocess.run([sys.executable, "-c", "import pyopencl as c\nfor p in c.get_platforms(): "
                          "print(len(p.get_devices()), p.name.strip())"],
                         env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        pytest.skip(f"no OpenCL platform on this machine: {out.stderr.strip()[-300:]}")
    return [line.split(" ", 1) for line in out.stdout.splitlines()]


@pytest.mark.timeout(300)
def test_platform_that_does_not_exist_lists_the_platforms_and_devices(tmp_path):
    platforms = _platforms()
    r = _run("opencl:5:0", tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    msg = r.stdout
    assert "CELERITAS_DEVICES='opencl:5:0': OpenCL platform 5 does not exist" in msg
    assert f"this machine has {len(platforms)} platform" in msg
    for p, (ndev, name) in enumerate(platforms):
        assert f"platform {p} {name!r}" in msg
        for d in range(int(ndev)):
            assert f"opencl:{p}:{d} " in msg
    assert "Traceback" not in r.stderr
    assert "pip install" not in msg   # (PyOpenCL is installed: no install hint)


@pytest.mark.timeout(300)
def test_device_that_does_not_exist_lists_the_devices(tmp_path):
    platforms = _platforms()
    ndev = int(platforms[0][0])
    r = _run(f"opencl:0:{ndev}", tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    msg = r.stdout
    assert f"OpenCL platform 0 {platforms[0][1]!r} has no device {ndev}" in msg
    assert "opencl:0:0 " in msg and f"opencl:0:{ndev - 1} " in msg


def test_missing_pyopencl_message_carries_the_install_hint(monkeypatch):
    from executor.backends import opencl
    from executor.backends.backend import BackendError
    monkeypatch.setattr(opencl, "cl", None)
    monkeypatch.setattr(opencl, "_IMPORT_ERROR", ImportError("No module named 'pyopencl'"))
    with pytest.raises(BackendError, match=r"PyOpenCL is not installed \(pip install 'celeritas\[opencl\]'\)"):
        opencl.opencl_devices([(0, 0)])
