"""Data flows one way: celeritas -> scheduler -> executor; the lower layers never import upward."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_scheduler_imports_neither_celeritas_nor_executor():
    for f in (ROOT / "scheduler").rglob("*.py"):
        bad = _imports(f) & {"celeritas", "executor"}
        assert not bad, f"{f.relative_to(ROOT)} imports {bad}"


def test_executor_imports_no_celeritas():
    for f in (ROOT / "executor").rglob("*.py"):
        bad = _imports(f) & {"celeritas"}
        assert not bad, f"{f.relative_to(ROOT)} imports {bad}"
