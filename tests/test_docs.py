"""The examples of the README and docs/ run, and do what the text around them says.

Every fenced ``python`` block of README.md, docs/api.md and docs/graphs.md is a complete
program (the examples assert what they claim); each runs in its own interpreter, in an
empty folder, with no ``CELERITAS_*`` variable set and a timeout.  The README's program
also runs on 2 MPI ranks, where it must print its line exactly once.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import run_job

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/api.md", "docs/graphs.md")
MPIEXEC = Path(sys.executable).with_name("mpiexec")
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def python_blocks(doc: str) -> list[tuple[int, str]]:
    """(line number, source) of every ```python block of ``doc``."""
    text = (ROOT / doc).read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


BLOCKS = [(doc, line, code) for doc in DOCS for line, code in python_blocks(doc)]


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERITAS_")}
    env["PYTHONPATH"] = str(ROOT)
    env["POCL_CACHE_DIR"] = str(tmp_path / "pocl")
    return env


def _run(argv: list[str], cwd: Path, env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    return run_job(argv, env, timeout, cwd=cwd)


def test_the_docs_have_examples():
    counts = {doc: len(python_blocks(doc)) for doc in DOCS}
    assert counts["README.md"] == 1 and counts["docs/api.md"] >= 14 and counts["docs/graphs.md"] >= 1, counts


@pytest.mark.timeout(300)
@pytest.mark.parametrize("doc, line, code", BLOCKS, ids=[f"{d}:{n}" for d, n, _ in BLOCKS])
def test_example_runs(doc, line, code, tmp_path):
    if 'devices="opencl"' in code:
        pytest.importorskip("pyopencl", reason="the example runs on the opencl backend")
    script = tmp_path / "example.py"
    script.write_text(code)
    r = _run([sys.executable, str(script)], tmp_path, _env(tmp_path))
    assert r.returncode == 0, f"{doc}:{line} failed\nstdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-4000:]


def _readme_program() -> tuple[str, str]:
    """The README's program and the line the README says it prints."""
    ((_line, code),) = python_blocks("README.md")
    text = (ROOT / "README.md").read_text()
    printed = re.search(r"prints `([^`]+)`", text).group(1)
    return code, printed


@pytest.mark.timeout(300)
def test_readme_program_prints_what_the_readme_says(tmp_path):
    code, printed = _readme_program()
    (tmp_path / "program.py").write_text(code)
    r = _run([sys.executable, "program.py"], tmp_path, _env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [printed]


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_readme_program_prints_once_on_two_ranks(tmp_path):
    if not MPIEXEC.exists():
        pytest.skip(f"needs {MPIEXEC} (pip install 'celeritas[mpi]')")
    code, printed = _readme_program()
    (tmp_path / "program.py").write_text(code)
    r = _run([sys.executable, "-m", "celeritas", "run", "-n", "2", "program.py"], tmp_path, _env(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [printed]


def _exported_names() -> list[str]:
    """Every name ``celeritas/__init__.py`` binds for users (its imports and assignments)."""
    tree = ast.parse((ROOT / "celeritas" / "__init__.py").read_text())
    names = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            names += [a.asname or a.name for a in node.names]
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def test_api_reference_names_every_exported_name():
    text = (ROOT / "docs" / "api.md").read_text()
    names = _exported_names()
    assert {"Queue", "Buffer", "reduction", "testing", "__version__"} <= set(names)
    missing = [n for n in names if not re.search(rf"\bcl\.{re.escape(n)}\b", text)]
    assert not missing, f"docs/api.md does not mention: {missing}"


def test_docs_links_resolve():
    for doc in ("README.md", "docs/api.md", "docs/graphs.md", "docs/cluster.md", "docs/benchmarks.md"):
        path = ROOT / doc
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{doc} links {target}, which does not exist"
