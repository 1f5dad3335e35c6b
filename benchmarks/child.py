"""Benchmarks that measure each configuration in a fresh process: one way to run the child.

The child is a script given as source; it prints its figures as one JSON line that starts
with ``RESULT `` (other output, warnings included, is ignored).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = "RESULT "


def run_child(code: str, args: list, env: dict[str, str | None], what: str, timeout: float = 3600) -> dict:
    """Run ``code`` with ``args`` in a fresh interpreter, this environment updated by ``env``
    (a None value removes the variable); returns its RESULT line's JSON."""
    full = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=full, capture_output=True, text=True,
                       cwd=ROOT, timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    raise RuntimeError(f"benchmark child failed ({what}):\n{p.stderr[-2000:]}")
